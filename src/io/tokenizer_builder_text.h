// The built-in text lathe's own tokenizer learns its merges from: plain
// English about workshops, models and everyday questions, with numbers,
// punctuation and line breaks so the merges cover the common cases.
#pragma once

namespace lathe {

inline constexpr const char* kTokenizerTrainingText = R"(A lathe is a machine that turns a piece of wood or metal against a cutting tool. The work spins, the tool stays still, and the shape comes out round. People have used lathes for thousands of years: the first ones were turned by hand or by a foot pedal, and later ones by water, steam and electric motors.

In a small workshop the lathe is often the first machine you learn. You set the speed, you check the tool, and you take a light cut first. If the cut is too deep, the tool will chatter and the surface will be rough. If it is too light, the work takes all day. A good turner listens to the machine as much as they watch it.

What is the best speed for a small part? It depends on the material. Soft wood can run fast; hard steel needs a slower speed and a sharp tool. Aluminium is easy to cut, but it sticks to the tool if you do not clean it. Brass cuts cleanly and is a pleasure to turn.

Questions people often ask:
1. How do I keep the part centered? Use a four-jaw chuck and a dial indicator.
2. Why does my tool wear out so fast? The speed is too high or the tool is not hard enough.
3. Can I cut threads on a lathe? Yes, with the lead screw and the right gears.
4. How long does it take to learn? A few weeks for the basics, a few years to be good.

A language model is another kind of machine. It reads a sequence of tokens and predicts the next one. The tokens are pieces of words: common words are one token, rare words are split into several. The model learns from a large amount of text, and then it can be tuned on a smaller set of examples for one task, such as answering questions about a bank account or a health plan.

The user asked: "What is my balance?" The assistant answered: "Your balance is 1,250.00 dollars as of today." The user then asked how to change the address on the account, and the assistant explained the steps one by one.

To train a model you need data, a recipe and time. The data is a list of examples, each with an input and an output. The recipe says how many steps to take, how large each batch is, and how fast the weights should change. The time depends on the size of the model and the speed of the machine: a small model trains in minutes on a laptop, a large one in days on many GPUs.

It's easy to forget that every tool has limits. We've seen models that answer well in one field and badly in another; they'll repeat what they read, and they're only as good as the data they learned from. I'd rather test a model on real questions than trust a number on a chart.

Numbers appear everywhere: 0, 1, 2, 3, 10, 42, 100, 256, 1024, 2048, 4096, 8192, 2024, 2025, 3.14, 0.5, 99%, $20, 7:30 pm, and 12/31. Dates like 2025-06-01 and times like 09:15 are common in records.

Hello! How are you today? I am fine, thank you. Could you help me with a question about my order? Of course, what would you like to know? The order number is 10482 and it has not arrived yet. Let me check that for you. The package left the warehouse on Monday and should arrive on Thursday.

def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, i))

The end of one story is the beginning of another. Thank you for reading.
)";

}  // namespace lathe
