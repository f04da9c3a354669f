// `seqpar train`'s command line (train_command.hpp): every option with its help and default,
// filled into TrainCliOptions, and the call of run_train.
#include "train_command.hpp"

#include <string>

#include "seqpar/model.hpp"

namespace seqpar::app {

void add_train_command(CLI::App& app, TrainCliOptions& o, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train a LLaMA-style model with each sequence split over N ranks (threads, MPI processes under mpirun, or processes under torchrun): "
      "attention through the distributed algorithms, gradients summed over the ranks, AdamW.\n"
      "Exit code: 0 when training finished, 1 on a runtime failure (a non-finite loss: the last saved checkpoint "
      "is kept), 2 for bad arguments, 143 when SIGTERM stopped it (after saving, with --save or --checkpoint-dir).");
  cmd->add_option("--model", o.model, "preset: " + model_preset_names())->capture_default_str();
  cmd->add_option("--config", o.config, "a JSON model config (our names or Hugging Face's config.json names)");
  cmd->add_option("--vocab", o.vocab, "override the model's vocabulary size");
  cmd->add_option("--data", o.data,
                  "recall (the embedded long-range task: the last token's target is a key placed in the second "
                  "quarter; its loss starts at ln 8 = 2.08 and falls only through attention across ranks) | "
                  "tokens:PATH[:u16|u32] (a flat token file) | text:PATH (bytes, vocab 256)")
      ->capture_default_str();
  cmd->add_option("--seq", o.seq, "tokens per sequence")->capture_default_str();
  cmd->add_option("--batch", o.batch, "sequences per step")->capture_default_str();
  cmd->add_option("--steps", o.steps, "optimizer steps")->capture_default_str();
  CLI::Option* ranks = cmd->add_option("--ranks", o.ranks,
                                       "sequence-parallel ranks (threads; cuda: default 1, more share GPU 0); under "
                                       "mpirun or torchrun: the process count")
                           ->capture_default_str();
  cmd->add_option("--gpus", o.gpus,
                  "cuda: N sequence-parallel ranks, one GPU each (a thread per GPU, NCCL between them), in place of "
                  "--ranks; under torchrun each process is one GPU rank instead");
  cmd->add_option("--data-parallel", o.data_parallel,
                  "data-parallel groups: the ranks form this many groups of consecutive ranks, each with its own "
                  "--batch sequences split over its ranks")
      ->capture_default_str();
  cmd->add_option("--zero", o.zero, "ZeRO stage over all ranks: 0, 1 (optimizer state sharded), 2 (and gradients "
                                    "reduce-scattered) or 3 (and parameters, gathered layer by layer)")
      ->capture_default_str();
  cmd->add_flag("--zero-overlap,!--no-zero-overlap", o.zero_overlap,
                "ZeRO 3: gather the next layer's weights and sum each layer's gradient on a second stream under "
                "the compute (one layer's weights more in memory); --no-zero-overlap runs them in line")
      ->capture_default_str();
  cmd->add_option("--algo", o.algo, "the attention algorithm (see seqpar attn --help) or auto")->capture_default_str();
  cmd->add_option("--ulysses", o.ulysses, "ulysses-ring: the Ulysses degree (0: the largest the heads allow in a node)")
      ->capture_default_str();
  cmd->add_option("--ring-algo", o.ring_algo, "ulysses-ring: the ring-family algorithm across the Ulysses groups")
      ->capture_default_str();
  cmd->add_option("--linear-sp", o.linear_sp,
                  "linear-attention layers over the ranks: lasp (LASP's state chain, rank to rank), lasp2 (one "
                  "all-gather of every rank's state contribution), ulysses (the LASP paper's baseline: all-to-alls "
                  "give each rank the whole sequence for heads/ranks of the heads, which must divide them), auto "
                  "(LASP's chain or all-gather, by a link model)")
      ->capture_default_str();
  cmd->add_option("--layout", o.layout,
                  "contiguous, zigzag, striped, or documents (with --pack and --batch 1: each step's documents "
                  "balanced over the ranks by their causal work); auto: zigzag, or contiguous for models with "
                  "linear-attention layers (LASP needs it)")
      ->capture_default_str();
  cmd->add_option("--ranks-per-node", o.ranks_per_node, "ranks per node (the double ring); 0: one node")
      ->capture_default_str();
  cmd->add_option("--checkpointing", o.checkpointing,
                  "none | full (re-run each layer in the backward) | attention (keep the attention's output and "
                  "LSE: the backward never re-runs attention or its communication) | sequence (BurstEngine's: keep "
                  "O and LSE of each shard's second half, re-run attention for the first half; striped layout)")
      ->capture_default_str();
  cmd->add_flag("--offload-checkpoints", o.offload_checkpoints,
                "keep what --checkpointing keeps of each layer (not none) in host memory from the layer's forward "
                "to its backward: on a GPU pinned host memory, copied out under the next layer's forward and back "
                "one layer ahead in the backward, so the device holds about two layers' checkpoints instead of "
                "all; the same bits as without, for host memory of about the checkpoints' bytes");
  cmd->add_option("--offload-keep-layers", o.offload_keep_layers,
                  "with --offload-checkpoints, the last N layers' checkpoints stay on the device (their backward "
                  "comes first): N - 1 layers' checkpoints fewer in host memory; the device's peak holds max(0, N - 2) "
                  "more (the layer before the last is there at the peak either way)")
      ->capture_default_str();
  cmd->add_option("--lr", o.lr, "peak learning rate (linear warmup, cosine to a tenth)")->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "warmup steps")->capture_default_str();
  cmd->add_option("--weight-decay", o.weight_decay, "AdamW's decoupled weight decay (matrices)")->capture_default_str();
  cmd->add_option("--clip", o.clip, "clip gradients to this global norm (0: no clipping)")->capture_default_str();
  cmd->add_option("--seed", o.seed, "seed of the parameters and the data")->capture_default_str();
  cmd->add_option("--threads-per-rank", o.threads_per_rank, "OpenMP threads per rank (default: cores / ranks)");
  cmd->add_option("--save", o.save, "write a checkpoint here at the end (and with --save-every)");
  cmd->add_option("--save-every", o.save_every, "also save every N steps");
  cmd->add_option("--resume", o.resume,
                  "continue from this checkpoint (same model and options), or auto: the newest whole one in "
                  "--checkpoint-dir (torn or corrupt ones are skipped; none: start from step 0), as a restarted "
                  "job (torchrun --max-restarts, a requeue) wants");
  cmd->add_option("--checkpoint-dir", o.checkpoint_dir,
                  "save step-numbered checkpoints here (every --save-every steps, at the end, and on SIGTERM)");
  cmd->add_option("--keep", o.keep, "checkpoints kept in --checkpoint-dir (0: all)")->capture_default_str();
  cmd->add_option("--plot", o.plot, "write the loss curve as an SVG here");
  cmd->add_option("--init-from", o.init_from, "start from these weights (safetensors, Llama naming; F32/F16/BF16)");
  cmd->add_option("--export", o.export_dir, "write model.safetensors and a Hugging Face config.json here at the end");
  cmd->add_option("--dump", o.dump_dir,
                  "record the run here (config, starting weights, every batch, the first step's gradient, losses) "
                  "for bench/hf_llama_check.py");
  cmd->add_flag("--json", o.json, "print one JSON line per step in place of the text line");
  cmd->add_option("--device", o.device,
                  "cpu, or cuda: bf16 on GPU 0 (more --ranks share it as threads; --gpus N or torchrun: a GPU per "
                  "rank); data-parallel groups, ZeRO and checkpoints as on the CPU (one trainer, one file format)")
      ->capture_default_str();
  cmd->add_option("--pack", o.pack,
                  "pack documents: each input of this token id ends a document (10: every line of a text:PATH "
                  "corpus); attention stays within a document, RoPE restarts in each, and the end token's "
                  "target (the next document's first token) is not counted");
  cmd->add_flag("--pack-global-positions", o.pack_global_positions,
                "with --pack: RoPE at the sequence's positions rather than restarting in each document");
  cmd->add_flag("--profile", o.profile,
                "time each step's work by kind (attention, products, LM head, norms, RoPE, SwiGLU, embedding, "
                "linear mixer, casts; between the ops; outside the pass): a work_ms object in --json's lines, a "
                "line per step otherwise (GPU: an event pair a device op)");
  cmd->add_option("--progress", o.progress,
                  "inside a long step, rank 0 says where its pass is (forward or backward, layers done, seconds "
                  "into the step) at most every this many seconds on stderr; 0: every layer; below 0: never")
      ->capture_default_str();
  cmd->add_flag("--deterministic", o.deterministic,
                "cuda: the same bits every run, so --resume continues a run exactly (the attention's backward "
                "through cuDNN's deterministic algorithm, whose workspace grows as the square of a call's rows)");
  cmd->add_option("--lm-head-chunk", o.lm_head_chunk,
                  "cuda: rows of logits the fused LM head + loss makes at once (0: all rows, an unfused head)")
      ->capture_default_str();
  cmd->add_option("--tile-tokens", o.tile_tokens,
                  "a rank's rows the MLP runs at a time (DeepSpeed ALST's tiled MLP): its gate, up and their "
                  "gradients exist for one tile at a time and the backward recomputes them tile by tile; a linear "
                  "mixer's backward steps before LASP go tile by tile too; 0: all rows at once, the MLP's "
                  "activations kept for the backward. The same losses and gradients to round-off (a product's "
                  "rows round by the call's row count; the tiled products' weight gradients sum tile by tile). "
                  "-1: 8192 with a --checkpointing policy (whose recompute the tiles shorten), 0 without")
      ->capture_default_str();
  cmd->callback([&o, exit_code, ranks] {
    o.ranks_given = ranks->count() > 0;
    *exit_code = run_train(o);
  });
}

}  // namespace seqpar::app
