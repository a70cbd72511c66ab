// A tiny llama.cpp client for our tests and benchmark: prints the token ids llama.cpp produces.
//
//   llamacpp-probe tokenize MODEL.gguf            < text     ids of stdin's text, one line
//   llamacpp-probe generate MODEL.gguf N THREADS [LORA.gguf]  < ids   greedy ids of N new tokens after the
//                                                                       prompt ids (with a LoRA adapter at scale 1)
//
// `generate` prints the new ids on one line, then "seconds PREFILL DECODE": the prompt's forward pass and the
// N - 1 single-token steps after it (model loading excluded), so a benchmark can time what `generate` does.
#include "llama.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace {

void quiet_log(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

int fail(const std::string & message) {
    std::fprintf(stderr, "llamacpp-probe: %s\n", message.c_str());
    return 2;
}

void print_ids(const std::vector<llama_token> & ids) {
    for (size_t i = 0; i < ids.size(); ++i) {
        std::printf(i ? " %d" : "%d", ids[i]);
    }
    std::printf("\n");
}

int tokenize(const llama_vocab * vocab) {
    std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    // No BOS added (we add none); parse_special so a literal <|endoftext|> becomes its id, as in our tokenizer.
    int n = -llama_tokenize(vocab, text.data(), (int) text.size(), nullptr, 0, false, true);
    std::vector<llama_token> ids(n);
    if (llama_tokenize(vocab, text.data(), (int) text.size(), ids.data(), n, false, true) != n) {
        return fail("tokenization failed");
    }
    print_ids(ids);
    return 0;
}

llama_token argmax(const float * logits, int n_vocab) {
    int best = 0;  // the first maximum wins, as torch.argmax
    for (int i = 1; i < n_vocab; ++i) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

int generate(llama_model * model, int n_new, int n_threads, const char * lora_path) {
    std::vector<llama_token> prompt;
    for (long id; std::cin >> id;) {
        prompt.push_back((llama_token) id);
    }
    if (prompt.empty() || n_new < 1) {
        return fail("generate needs prompt ids on stdin and N >= 1");
    }
    llama_context_params params = llama_context_default_params();
    params.n_ctx = (uint32_t) (prompt.size() + n_new);
    params.n_batch = params.n_ubatch = (uint32_t) prompt.size();
    params.n_threads = params.n_threads_batch = n_threads;
    // An f32 KV cache, as ours: the default f16 cache rounds keys and values, which can flip a greedy near-tie.
    params.type_k = params.type_v = GGML_TYPE_F32;
    llama_context * ctx = llama_init_from_model(model, params);
    if (ctx == nullptr) {
        return fail("cannot create a context");
    }
    if (lora_path != nullptr) {
        llama_adapter_lora * adapter = llama_adapter_lora_init(model, lora_path);
        float scale = 1.0f;
        if (adapter == nullptr || llama_set_adapters_lora(ctx, &adapter, 1, &scale) != 0) {
            return fail(std::string("cannot apply the adapter ") + lora_path);
        }
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    std::vector<llama_token> out;
    const auto start = std::chrono::steady_clock::now();
    if (llama_decode(ctx, llama_batch_get_one(prompt.data(), (int) prompt.size())) != 0) {
        return fail("prefill failed");
    }
    llama_token next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
    const auto prefilled = std::chrono::steady_clock::now();
    for (int i = 0; i < n_new; ++i) {
        out.push_back(next);
        if (i + 1 == n_new) {
            break;
        }
        if (llama_decode(ctx, llama_batch_get_one(&next, 1)) != 0) {
            return fail("decode failed at step " + std::to_string(i));
        }
        next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
    }
    const auto end = std::chrono::steady_clock::now();
    print_ids(out);
    std::printf("seconds %.6f %.6f\n", std::chrono::duration<double>(prefilled - start).count(),
                std::chrono::duration<double>(end - prefilled).count());
    llama_free(ctx);
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (argc < 3 || (mode != "tokenize" && mode != "generate") || (mode == "generate" && argc < 5)) {
        return fail("usage: llamacpp-probe tokenize MODEL < text | generate MODEL N THREADS [LORA] < ids");
    }
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    llama_model_params model_params = llama_model_default_params();
    // No extra buffer types: ggml's AMX one (taken for Q4_1 on CPUs with AMX) crashed (SIGSEGV) on the shipped
    // SmolLM2 Q4_1 file on an Intel Xeon with AMX; the plain CPU kernels are llama.cpp's path on every other CPU.
    model_params.use_extra_bufts = false;
    llama_model * model = llama_model_load_from_file(argv[2], model_params);
    if (model == nullptr) {
        return fail(std::string("cannot load ") + argv[2]);
    }
    const int rc = mode == "tokenize" ? tokenize(llama_model_get_vocab(model))
                                      : generate(model, std::atoi(argv[3]), std::atoi(argv[4]),
                                                 argc > 5 ? argv[5] : nullptr);
    llama_model_free(model);
    llama_backend_free();
    return rc;
}
