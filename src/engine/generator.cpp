// The single-sequence generation loop. It reads as the algorithm does:
// prefill → sample → (emit, check stops, step one token, sample)*. Timing
// splits at the first sampled token, so prefill and decode throughput are
// reported the way serving systems report them.
#include "engine/generator.h"

#include <algorithm>
#include <chrono>

namespace lathe {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The loop itself, over a model that picks tokens: first(prompt) runs the
// prompt and returns the first pick, then(id) appends id and returns the
// next. generate_with() builds them from a step and a Sampler; on a
// CudaCausalLM the device picks (CudaCausalLM::start_decode).
using FirstFn = std::function<Result<int32_t>(std::span<const int32_t> prompt)>;
using ThenFn = std::function<Result<int32_t>(int32_t id, int budget_left)>;

Result<GenerationResult> generate_loop(const FirstFn& first, const ThenFn& then, int vocab_size,
                                       const Tokenizer& tokenizer, const GenerateArgs& args,
                                       const TextCallback& on_text) {
  const SamplingOptions& so = args.sampling;
  LATHE_TRY(so.validate());
  const int n_prompt = static_cast<int>(args.prompt.size());
  if (n_prompt == 0) return invalid_argument("generate: the prompt is empty (it needs at least one token)");
  if (vocab_size <= 0) return invalid_argument("generate: vocab_size must be positive, got ", vocab_size);
  for (int32_t id : args.prompt)
    if (id < 0 || id >= vocab_size)
      return invalid_argument("generate: prompt token id ", id, " is outside the vocabulary [0, ", vocab_size, ")");
  int budget = so.max_new_tokens;
  if (args.max_context_tokens > 0) {
    if (n_prompt >= args.max_context_tokens)
      return invalid_argument("generate: the prompt has ", n_prompt, " tokens, which leaves no room in the model's ",
                              args.max_context_tokens, "-token context");
    budget = std::min(budget, args.max_context_tokens - n_prompt);
  }

  GenerationResult r;
  r.prompt_tokens = n_prompt;
  r.finish_reason = "length";
  if (budget == 0) return r;

  IncrementalDecoder decoder(tokenizer, args.skip_special_tokens);
  StopMatcher stops(so.stop_strings);
  auto emit = [&](const std::string& piece) {
    if (piece.empty()) return;
    r.text += piece;
    if (on_text) on_text(piece);
  };
  auto is_stop_token = [&](int32_t id) {
    return std::find(so.stop_token_ids.begin(), so.stop_token_ids.end(), id) != so.stop_token_ids.end();
  };

  Clock::time_point t0 = Clock::now();
  LATHE_ASSIGN_OR_RETURN(int32_t next, first(args.prompt));
  r.prefill_seconds = seconds_since(t0);

  Clock::time_point t1 = Clock::now();
  while (true) {
    r.token_ids.push_back(next);
    if (is_stop_token(next)) {
      r.finish_reason = "stop";
      break;
    }
    emit(stops.push(decoder.push(next)));
    if (stops.stopped()) {
      r.finish_reason = "stop";
      break;
    }
    const int left = budget - static_cast<int>(r.token_ids.size());
    if (left <= 0) break;
    LATHE_ASSIGN_OR_RETURN(next, then(next, left));
    ++r.decode_steps;
  }
  r.decode_seconds = seconds_since(t1);

  // What the decoder held back (an unfinished UTF-8 sequence) may still finish a stop string.
  if (!stops.stopped()) emit(stops.push(decoder.flush()));
  if (stops.stopped()) {
    r.finish_reason = "stop";
  } else {
    emit(stops.flush());
  }
  return r;
}

}  // namespace

Result<GenerationResult> generate_with(const StepFn& step, int vocab_size, const Tokenizer& tokenizer,
                                       const GenerateArgs& args, const TextCallback& on_text) {
  Sampler sampler(args.sampling);
  std::vector<int32_t> context(args.prompt.begin(), args.prompt.end());
  std::vector<float> logits(static_cast<size_t>(std::max(vocab_size, 0)));
  FirstFn first = [&](std::span<const int32_t> prompt) -> Result<int32_t> {
    LATHE_TRY(step(prompt, logits));
    return sampler.sample(logits, context);
  };
  ThenFn then = [&](int32_t id, int) -> Result<int32_t> {
    context.push_back(id);
    LATHE_TRY(step(std::span<const int32_t>(&id, 1), logits));
    return sampler.sample(logits, context);
  };
  return generate_loop(first, then, vocab_size, tokenizer, args, on_text);
}

Result<GenerationResult> generate(const CausalLM& model, const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                                  const SamplingOptions& sampling, const TextCallback& on_text) {
  const ModelConfig& cfg = model.config();
  int64_t wanted = static_cast<int64_t>(prompt.size()) + sampling.max_new_tokens;
  int max_context = cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : 0;
  int64_t capacity = max_context > 0 ? std::min<int64_t>(wanted, max_context) : wanted;
  KvCache cache = model.new_cache(static_cast<int>(std::max<int64_t>(capacity, 1)));
  const int vocab = cfg.vocab_size;
  StepFn step = [&](std::span<const int32_t> tokens, std::span<float> logits) {
    TensorView out{.data = logits.data(), .dtype = DType::F32, .shape = Shape{1, vocab}};
    return model.forward(tokens, cache, out, /*all_logits=*/false);
  };
  GenerateArgs args{.prompt = prompt, .sampling = sampling, .max_context_tokens = max_context};
  return generate_with(step, vocab, tokenizer, args, on_text);
}

Result<GenerationResult> generate(CudaCausalLM& model, const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                                  const SamplingOptions& sampling, const TextCallback& on_text) {
  model.clear();
  GenerateArgs args{.prompt = prompt, .sampling = sampling, .max_context_tokens = model.max_seq()};
  if (!(sampling.greedy() && sampling.repetition_penalty == 1.0f) && !model.samples_on_device()) {
    StepFn step = [&](std::span<const int32_t> tokens, std::span<float> logits) {
      return model.forward(tokens, logits);
    };
    return generate_with(step, model.config().vocab_size, tokenizer, args, on_text);
  }
  // The device picks every token (greedy, or drawn under temperature /
  // top-k / top-p / min-p, after the repetition penalty) and feeds it to the
  // next step itself (CudaCausalLM::start_decode), steps queued ahead of the
  // host; those past a stop are dropped. (Drawn on the device, a seed gives
  // other tokens than the CPU's sampler would.)
  const CudaSampling cs{.temperature = sampling.temperature, .top_k = sampling.top_k, .top_p = sampling.top_p,
                        .min_p = sampling.min_p, .repetition_penalty = sampling.repetition_penalty,
                        .seed = sampling.seed};
  bool started = false;
  FirstFn first = [&](std::span<const int32_t> p) { return model.forward_pick(p, cs); };
  ThenFn then = [&](int32_t id, int left) -> Result<int32_t> {
    if (!started) {
      LATHE_TRY(model.start_decode(std::span<const int32_t>(&id, 1), left, cs));
      started = true;
    }
    int32_t pick = 0;
    LATHE_TRY(model.next_tokens(std::span<int32_t>(&pick, 1)));
    return pick;
  };
  Result<GenerationResult> r = generate_loop(first, then, model.config().vocab_size, tokenizer, args, on_text);
  model.stop_decode();
  return r;
}

std::vector<int32_t> default_stop_token_ids(const GenerationConfig& gen, const ModelConfig& cfg,
                                            const Tokenizer& tokenizer) {
  if (!gen.eos_token_ids.empty()) return {gen.eos_token_ids.begin(), gen.eos_token_ids.end()};
  if (!cfg.eos_token_ids.empty()) return {cfg.eos_token_ids.begin(), cfg.eos_token_ids.end()};
  if (auto eos = tokenizer.eos_token_id()) return {*eos};
  return {};
}

}  // namespace lathe
