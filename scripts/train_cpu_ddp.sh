#!/usr/bin/env bash
# CPU data-parallel training with fairseq-train under torchrun (gloo backend).
#
#   torchrun --nproc-per-node 2 --no-python scripts/train_cpu_ddp.sh DATA \
#       --user-dir rag_plugin --task retrieval_augmented --knowledge KS \
#       --arch rag_token_tiny --criterion marginal_nll --n-docs 3 \
#       --optimizer adam --lr 1e-3 --batch-size 8 --max-epoch 2 --save-dir CKPT --num-workers 0
#
# Every process (rank) is one fairseq worker: it loads the knowledge source and builds its
# own retriever and model, reads its own shard of every epoch's batches (shards differ per
# rank with the same --seed) and gradients are summed with gloo all-reduce, so the global
# batch is --batch-size x --update-freq x WORLD_SIZE. fairseq's own launcher cannot do this on
# CPU (it counts CUDA devices), hence torchrun + these flags:
#   --cpu --distributed-init-method env:// --distributed-world-size $WORLD_SIZE
#   --distributed-rank $RANK --distributed-no-spawn --distributed-backend gloo
#   --ddp-backend legacy_ddp   unless the arguments name one: --ddp-backend pytorch_ddp trains with torch's
#                              DistributedDataParallel (the plugin wraps a CPU model without CUDA device_ids)
# On resume rank 0 loads checkpoint_last.pt (safe loading, weights_only=True, with the
# plugin's allow-list) and broadcasts it; the other ranks unpickle fairseq's tensor
# placeholders, which the allow-list includes.
# Only rank 0 logs at INFO level and writes checkpoints; rerun the same command to resume.
#
# Which fairseq-train: $FAIRSEQ_TRAIN if set (any executable taking fairseq-train's
# arguments), else the one next to the python running torchrun, else next to `python` on
# PATH, else this repository's .venv/bin, else fairseq-train on PATH.
set -euo pipefail

if [[ -z "${WORLD_SIZE:-}" || -z "${RANK:-}" ]]; then
    echo "error: WORLD_SIZE/RANK not set (run me as: torchrun --nproc-per-node N --no-python $0 DATA ARGS...)" >&2
    exit 2
fi
if [[ $# -lt 1 ]]; then
    echo "error: no arguments (usage: torchrun --nproc-per-node N --no-python $0 DATA ARGS...)" >&2
    exit 2
fi

train="${FAIRSEQ_TRAIN:-}"
if [[ -z "$train" ]]; then
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    # the python running torchrun (our parent): argv[0] of its command line, as launched
    launcher=""
    if [[ -r "/proc/$PPID/cmdline" ]]; then
        launcher="$(tr '\0' '\n' < "/proc/$PPID/cmdline" | head -n 1 || true)"
        [[ "$launcher" == */* ]] || launcher="$(command -v "$launcher" || true)"
    fi
    py="$(command -v python || command -v python3 || true)"
    for cand in ${launcher:+"$(dirname "$launcher")/fairseq-train"} ${py:+"$(dirname "$py")/fairseq-train"} \
                "$here/../.venv/bin/fairseq-train" "$(command -v fairseq-train || true)"; do
        if [[ -n "$cand" && -x "$cand" ]]; then
            train="$cand"
            break
        fi
    done
fi
if [[ -z "$train" ]]; then
    echo "error: fairseq-train not found (activate the venv, or set FAIRSEQ_TRAIN=/path/to/fairseq-train)" >&2
    exit 2
fi

if [[ "$RANK" == 0 ]]; then
    echo "train_cpu_ddp.sh: $WORLD_SIZE ranks, gloo, $train" >&2
fi

# torchrun sets OMP_NUM_THREADS=1 per process when it starts several; keep an explicit value.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

ddp=(--ddp-backend legacy_ddp)
for arg in "$@"; do
    [[ "$arg" == --ddp-backend* ]] && ddp=()
done

exec "$train" "$@" \
    --cpu \
    --distributed-init-method env:// \
    --distributed-world-size "$WORLD_SIZE" \
    --distributed-rank "$RANK" \
    --distributed-no-spawn \
    --distributed-backend gloo \
    ${ddp[@]+"${ddp[@]}"}
