// Recipes: defaults, YAML (nested and dotted), command-line overrides, the
// error messages for unknown keys and wrong types, validation, and the YAML
// written back loading to the same recipe.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "train/recipe.h"

namespace lathe {
namespace {

bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "lathe_recipe_" + name; }

TEST(Recipe, DefaultsFollowNemoLoraAndValidate) {
  const TrainRecipe r;
  EXPECT_EQ(r.peft.peft_scheme, PeftScheme::kLora);
  EXPECT_EQ(r.peft.dim, 32);
  EXPECT_EQ(r.peft.alpha, 32.0);
  EXPECT_EQ(r.peft.dropout, 0.0);
  EXPECT_EQ(r.peft.target_modules, (std::vector<std::string>{"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"}));
  auto hf = hf_target_modules(r.peft);
  ASSERT_TRUE(hf.is_ok());
  EXPECT_EQ(*hf, (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  EXPECT_EQ(r.data.seq_length, 2048);
  EXPECT_EQ(r.data.prompt_template, "{input} {output}");
  EXPECT_EQ(r.optim.lr, 1e-4);
  EXPECT_EQ(r.optim.weight_decay, 0.01);
  EXPECT_EQ(r.trainer.gradient_clip_val, 1.0);
  EXPECT_EQ(r.optim.sched.name, LrScheduleKind::kCosine);
  EXPECT_TRUE(validate(r).is_ok());
  EXPECT_TRUE(validate(r, 8).is_ok());  // 128 = 1 x 8 x 16
}

TEST(Recipe, YamlTakesNestedAndDottedKeysThenOverridesWin) {
  const std::string path = temp_path("mixed.yaml");
  {
    std::ofstream f(path);
    f << "peft:\n  dim: 16\n  target_modules: [q_proj, v_proj]\n"
         "trainer.max_steps: 200\n"
         "optim:\n  lr: 3.0e-4\n  sched.warmup_steps: 10\n  sched:\n    name: CosineAnnealing\n"
         "data:\n  prompt_template: \"Q: {input}\\nA: {output}\"\n  packed_sequence: yes\n";
  }
  const std::vector<std::string> overrides = {"peft.dim=8", "optim.betas=[0.9, 0.95]", "data.shuffle=false"};
  auto r = load_recipe(path, overrides);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->peft.dim, 8);  // the override wins over the file
  EXPECT_EQ(r->peft.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(r->trainer.max_steps, 200);
  EXPECT_EQ(r->optim.lr, 3e-4);
  EXPECT_EQ(r->optim.sched.warmup_steps, 10);
  EXPECT_EQ(r->optim.sched.name, LrScheduleKind::kCosine);
  EXPECT_EQ(r->data.prompt_template, "Q: {input}\nA: {output}");
  EXPECT_TRUE(r->data.packed_sequence);
  EXPECT_FALSE(r->data.shuffle);
  EXPECT_EQ(r->optim.betas[1], 0.95);
  std::remove(path.c_str());
}

TEST(Recipe, OverridesParseEachType) {
  TrainRecipe r;
  ASSERT_TRUE(apply_recipe_override(&r, "peft.target_modules=linear_qkv,down_proj").is_ok());
  EXPECT_EQ(r.peft.target_modules, (std::vector<std::string>{"linear_qkv", "down_proj"}));
  ASSERT_TRUE(apply_recipe_override(&r, "peft.target_modules=[ 'o_proj' , up_proj ]").is_ok());
  EXPECT_EQ(r.peft.target_modules, (std::vector<std::string>{"o_proj", "up_proj"}));
  ASSERT_TRUE(apply_recipe_override(&r, "optim.lr=2e-5").is_ok());
  EXPECT_EQ(r.optim.lr, 2e-5);
  ASSERT_TRUE(apply_recipe_override(&r, "trainer.activations_checkpoint=True").is_ok());
  EXPECT_TRUE(r.trainer.activations_checkpoint);
  EXPECT_EQ(r.trainer.activations_checkpoint_granularity, "full");
  ASSERT_TRUE(apply_recipe_override(&r, "trainer.activations_checkpoint_granularity=selective").is_ok());
  EXPECT_EQ(r.trainer.activations_checkpoint_granularity, "selective");
  ASSERT_TRUE(apply_recipe_override(&r, "peft.peft_scheme=none").is_ok());
  EXPECT_EQ(r.peft.peft_scheme, PeftScheme::kNone);
  EXPECT_EQ(r.trainer.gpu_memory_gib, 0.0);  // the GPU's free memory
  ASSERT_TRUE(apply_recipe_override(&r, "trainer.gpu_memory_gib=37.25").is_ok());
  EXPECT_EQ(r.trainer.gpu_memory_gib, 37.25);
  ASSERT_TRUE(apply_recipe_override(&r, "data.prompt_template=\"{input}\\t{output}\"").is_ok());
  EXPECT_EQ(r.data.prompt_template, "{input}\t{output}");
  ASSERT_TRUE(apply_recipe_override(&r, "data.prompt_template={input} => {output}").is_ok());
  EXPECT_EQ(r.data.prompt_template, "{input} => {output}");  // unquoted: taken as written
  ASSERT_TRUE(apply_recipe_override(&r, "data.on_error=skip").is_ok());
  EXPECT_EQ(r.data.on_error, OnError::kSkip);
  ASSERT_TRUE(apply_recipe_override(&r, "data.on_error=fail").is_ok());  // alias of stop
  EXPECT_EQ(r.data.on_error, OnError::kStop);
  EXPECT_EQ(*get_recipe_value(r, "data.on_error"), "stop");
  ASSERT_TRUE(apply_recipe_override(&r, "data.truncation=drop").is_ok());
  EXPECT_EQ(r.data.truncation, Truncation::kDrop);
}

TEST(Recipe, PrecisionTakesNemosNames) {
  TrainRecipe r;
  EXPECT_EQ(r.trainer.precision, Precision::kF32);
  ASSERT_TRUE(apply_recipe_override(&r, "trainer.precision=bf16-mixed").is_ok());
  EXPECT_EQ(r.trainer.precision, Precision::kBf16Mixed);
  ASSERT_TRUE(apply_recipe_override(&r, "trainer.precision=32").is_ok());
  EXPECT_EQ(r.trainer.precision, Precision::kF32);
  Status s = apply_recipe_override(&r, "trainer.precision=16-mixed");
  ASSERT_FALSE(s.is_ok());
  EXPECT_TRUE(contains(s.message(), "bf16-mixed")) << s.message();
}

TEST(Recipe, UnknownKeysNameTheKeyAndSuggestTheClosest) {
  TrainRecipe r;
  Status s = apply_recipe_override(&r, "peft.dmi=16");
  ASSERT_FALSE(s.is_ok());
  EXPECT_TRUE(contains(s.message(), "'peft.dmi'")) << s.message();
  EXPECT_TRUE(contains(s.message(), "did you mean 'peft.dim'")) << s.message();
  s = apply_recipe_override(&r, "peft.lora_alpha=16");
  EXPECT_TRUE(contains(s.message(), "'peft.alpha'")) << s.message();
  s = apply_recipe_override(&r, "trainer.max_step=5");
  EXPECT_TRUE(contains(s.message(), "'trainer.max_steps'")) << s.message();
  s = apply_recipe_yaml(&r, "peft:\n  dim: 16\n  use_rslora: true\n", "r.yaml");
  ASSERT_FALSE(s.is_ok());
  EXPECT_TRUE(contains(s.message(), "r.yaml:3")) << s.message();
  EXPECT_TRUE(contains(s.message(), "'peft.use_rslora'")) << s.message();
  EXPECT_TRUE(contains(s.message(), "'peft.rslora'")) << s.message();
  s = apply_recipe_override(&r, "peft.dim");
  EXPECT_TRUE(contains(s.message(), "no '='")) << s.message();
  s = apply_recipe_override(&r, "optim.sched=cosine");
  EXPECT_TRUE(contains(s.message(), "group of keys")) << s.message();
}

TEST(Recipe, WrongTypesNameKeyValueAndExpectedType) {
  TrainRecipe r;
  Status s = apply_recipe_override(&r, "peft.dim=abc");
  ASSERT_FALSE(s.is_ok());
  EXPECT_TRUE(contains(s.message(), "'peft.dim'") && contains(s.message(), "'abc'") && contains(s.message(), "int"))
      << s.message();
  s = apply_recipe_yaml(&r, "trainer:\n  max_steps: 1.5\n", "r.yaml");
  EXPECT_TRUE(contains(s.message(), "r.yaml:2") && contains(s.message(), "'1.5'")) << s.message();
  s = apply_recipe_override(&r, "data.shuffle=maybe");
  EXPECT_TRUE(contains(s.message(), "true or false")) << s.message();
  s = apply_recipe_override(&r, "optim.sched.name=exponential");
  EXPECT_TRUE(contains(s.message(), "cosine|linear|constant")) << s.message();
  s = apply_recipe_override(&r, "peft.target_modules=[q_proj, qkv]");
  EXPECT_TRUE(contains(s.message(), "'qkv'") && contains(s.message(), "linear_qkv|")) << s.message();
  s = apply_recipe_override(&r, "optim.betas=[0.9]");
  EXPECT_TRUE(contains(s.message(), "two numbers")) << s.message();
  s = apply_recipe_override(&r, "optim.lr=nan");
  EXPECT_TRUE(contains(s.message(), "finite")) << s.message();
  s = apply_recipe_yaml(&r, "peft:\n  dim: [1, 2]\n", "r.yaml");
  EXPECT_TRUE(contains(s.message(), "'[1, 2]'")) << s.message();
  EXPECT_EQ(r.peft.dim, 32);  // failed sets leave the field alone
}

TEST(Recipe, YamlStructureErrorsCarryLineNumbers) {
  TrainRecipe r;
  Status s = apply_recipe_yaml(&r, "peft:\n  dim: 16\npeft.dim: 8\n", "dup.yaml");
  EXPECT_TRUE(contains(s.message(), "dup.yaml:3") && contains(s.message(), "twice")) << s.message();
  s = apply_recipe_yaml(&r, "peft: lora\n", "sec.yaml");
  EXPECT_TRUE(contains(s.message(), "group of keys")) << s.message();
  s = apply_recipe_yaml(&r, "peft:\n  dim: [16\n", "bad.yaml");
  EXPECT_TRUE(contains(s.message(), "bad.yaml:") && contains(s.message(), "YAML")) << s.message();
  s = apply_recipe_yaml(&r, "- a\n- b\n", "list.yaml");
  EXPECT_TRUE(contains(s.message(), "map")) << s.message();
  s = apply_recipe_yaml(&r, "trainer:\n  seed:\n", "null.yaml");
  EXPECT_TRUE(contains(s.message(), "no value")) << s.message();
  EXPECT_TRUE(apply_recipe_yaml(&r, "", "empty.yaml").is_ok());
  s = apply_recipe_file(&r, temp_path("does_not_exist.yaml"));
  EXPECT_EQ(s.code(), StatusCode::kIoError);
}

TEST(Recipe, ValidateChecksRangesAndConsistency) {
  TrainRecipe r;
  r.data.global_batch_size = 12;
  r.data.micro_batch_size = 2;
  Status s = validate(r, 4);
  EXPECT_TRUE(contains(s.message(), "data.global_batch_size (12)") && contains(s.message(), "use 8 or 16"))
      << s.message();
  EXPECT_TRUE(validate(r, 3).is_ok());
  r = TrainRecipe{};
  r.data.packed_sequence = true;
  r.data.micro_batch_size = 2;
  EXPECT_TRUE(contains(validate(r).message(), "packed_sequence")) << validate(r).message();
  r = TrainRecipe{};
  r.optim.sched.min_lr = 1e-3;
  EXPECT_TRUE(contains(validate(r).message(), "optim.sched.min_lr"));
  r = TrainRecipe{};
  r.trainer.max_steps = 20;  // warmup 50 > 20
  EXPECT_TRUE(contains(validate(r).message(), "optim.sched.warmup_steps"));
  r = TrainRecipe{};
  r.peft.dropout = 1.0;
  EXPECT_TRUE(contains(validate(r).message(), "peft.dropout"));
  r.peft.peft_scheme = PeftScheme::kNone;  // LoRA keys do not matter for full SFT
  EXPECT_TRUE(validate(r).is_ok());
  r = TrainRecipe{};
  r.peft.target_modules.clear();
  EXPECT_TRUE(contains(validate(r).message(), "peft.target_modules"));
  r = TrainRecipe{};
  r.trainer.max_steps = -1;
  EXPECT_TRUE(contains(validate(r).message(), "never end"));
  r.trainer.max_epochs = 3;
  EXPECT_TRUE(validate(r).is_ok());
  r = TrainRecipe{};
  r.data.prompt_template = "{input}";
  EXPECT_TRUE(contains(validate(r).message(), "data.prompt_template")) << validate(r).message();
  r.data.label_key = "input";  // now {input} is the supervised field
  EXPECT_TRUE(validate(r).is_ok()) << validate(r).message();
  r = TrainRecipe{};
  r.optim.betas = {0.9, 1.0};
  EXPECT_TRUE(contains(validate(r).message(), "optim.betas"));
  r = TrainRecipe{};
  r.trainer.gpu_memory_gib = -1.0;
  EXPECT_TRUE(contains(validate(r).message(), "trainer.gpu_memory_gib")) << validate(r).message();
  r.trainer.gpu_memory_gib = std::nan("");
  EXPECT_TRUE(contains(validate(r).message(), "trainer.gpu_memory_gib")) << validate(r).message();
  r.trainer.gpu_memory_gib = 40.0;
  EXPECT_TRUE(validate(r).is_ok());
  EXPECT_FALSE(validate(TrainRecipe{}, 0).is_ok());
}

TEST(Recipe, WrittenYamlLoadsBackToTheSameRecipe) {
  TrainRecipe r;
  for (const char* o : {"peft.dim=7", "peft.alpha=14.5", "peft.rslora=true", "peft.dropout_position=post",
                        "peft.target_modules=[gate_proj, linear_qkv]", "trainer.max_steps=333",
                        "trainer.seed=42", "data.dataset_root=/data/my set", "optim.lr=1.2345678901234567e-4",
                        "optim.sched.name=linear", "optim.sched.min_lr=1e-7", "data.truncation=drop",
                        "data.prompt_template=\"<s>\\\"{input}\\\"\\n\\t{output}\\\\\""}) {
    ASSERT_TRUE(apply_recipe_override(&r, o).is_ok()) << o;
  }
  EXPECT_EQ(r.data.prompt_template, "<s>\"{input}\"\n\t{output}\\");
  const std::string path = temp_path("round_trip.yaml");
  ASSERT_TRUE(write_recipe_yaml(r, path).is_ok());
  auto back = load_recipe(path, {});
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  for (const RecipeKeyInfo& k : recipe_keys()) {
    auto a = get_recipe_value(r, k.name);
    auto b = get_recipe_value(*back, k.name);
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    EXPECT_EQ(*a, *b) << k.name;
  }
  EXPECT_EQ(back->optim.lr, r.optim.lr);  // shortest round-trip float text
  EXPECT_EQ(back->data.prompt_template, r.data.prompt_template);
  EXPECT_EQ(recipe_to_yaml(*back), recipe_to_yaml(r));
  std::remove(path.c_str());
}

TEST(Recipe, EveryKeyAcceptsItsOwnRenderedDefault) {
  ASSERT_GE(recipe_keys().size(), 30u);
  for (const RecipeKeyInfo& k : recipe_keys()) {
    TrainRecipe r;
    Status s = set_recipe_value(&r, k.name, k.default_value);
    EXPECT_TRUE(s.is_ok()) << k.name << ": " << s.message();
    EXPECT_EQ(*get_recipe_value(r, k.name), k.default_value) << k.name;
    EXPECT_FALSE(k.doc.empty()) << k.name;
  }
  EXPECT_FALSE(get_recipe_value(TrainRecipe{}, "nope").is_ok());
}

TEST(Recipe, HelpListsEveryKeyWithItsDefault) {
  const std::string help = render_recipe_help();
  for (const RecipeKeyInfo& k : recipe_keys()) {
    EXPECT_TRUE(contains(help, k.name)) << k.name;
  }
  EXPECT_TRUE(contains(help, "peft.dim")) << help;
  EXPECT_TRUE(contains(help, "[linear_qkv, linear_proj, linear_fc1, linear_fc2]")) << help;
  EXPECT_TRUE(contains(help, "lora|none")) << help;
  EXPECT_TRUE(contains(help, "\"{input} {output}\"")) << help;
}

TEST(Recipe, DerivedSettings) {
  TrainRecipe r;
  r.peft.dim = 16;
  r.peft.alpha = 32;
  EXPECT_DOUBLE_EQ(lora_scale(r.peft), 2.0);
  r.peft.rslora = true;
  EXPECT_DOUBLE_EQ(lora_scale(r.peft), 8.0);
  r.data.global_batch_size = 64;
  r.data.micro_batch_size = 4;
  EXPECT_EQ(grad_accumulation_steps(r, 2), 8);
  r.peft.target_modules = {"down_proj", "linear_qkv", "q_proj"};
  EXPECT_EQ(*hf_target_modules(r.peft), (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "down_proj"}));
  LrScheduleConfig sc = lr_schedule_config(r, 500);
  EXPECT_EQ(sc.max_steps, 500);
  EXPECT_EQ(sc.max_lr, r.optim.lr);
  EXPECT_EQ(sc.warmup_steps, 50);
  r.optim.sched.max_steps = 300;
  EXPECT_EQ(lr_schedule_config(r, 500).max_steps, 300);
  const AdamWConfig ac = adamw_config(r);
  EXPECT_EQ(ac.beta2, 0.98);
  EXPECT_EQ(ac.weight_decay, 0.01);
}

}  // namespace
}  // namespace lathe
