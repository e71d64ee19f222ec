#!/usr/bin/env bash
# GPU check (docs/gpu.md): DAC and Mimi, fp32 and fp16, on the CUDA EP against the CPU EP.
#
#   scripts/gpu_check.sh [prepare]     here, with the [export] extra (torch): exports the tiny
#                                      folders, fetches and packs the wheels into .gpu/, dry-runs
#                                      the check on the CPU, prints the device tool's `run` calls
#   scripts/gpu_check.sh device        on the GPU machine: what that `run` call executes
#   scripts/gpu_check.sh device-full   on the GPU machine right after `device`, while it is warm:
#                                      the real-size presets, exported there
#   scripts/gpu_check.sh device-serve  on the GPU machine after `device`, while it is warm:
#                                      codec-bench serve on CUDA (issue 24: the streams one GPU holds)
#   scripts/gpu_check.sh prepare-split here, fallback: the whole onnxruntime-gpu wheel in parts
#   scripts/gpu_check.sh device-part N on the GPU machine: stage part N of the fallback
#
# The GPU machine reaches no registry and gets the working tree plus carried paths, 64 MiB in
# all per call: what it needs beyond its image (Python 3.12, numpy, torch cu130 with the CUDA 13
# and cuDNN 9 libraries, click, tqdm, threadpoolctl) travels in .gpu/.
set -euo pipefail
cd "$(dirname "$0")/.."

STAGE=.gpu
FULL_STAGE=.gpu-full
# The 256 MB wheel stays out of the carried folders; its packed form travels.
CACHE=${CODECPORT_GPU_CACHE:-$HOME/.cache/codecport-gpu}
# Built for CUDA 13.0 and cuDNN 9, the libraries the device's torch (cu130) brings along.
ORT_GPU=onnxruntime-gpu==1.31.1
# What codecport's runtime imports that the device image lacks (the versions tested here).
WHEELS=(soundfile==0.14.0 soxr==1.1.0 cffi==2.1.1 pycparser==3.12 pyloudnorm==0.2.0)
# codec-export's simplifier, for device-full; 9 MiB, so it cannot share the first call's carry.
FULL_WHEELS=(onnxsim==0.8.1)
# The device runs Python 3.12 on x86-64, whatever this machine is.
PIP_TARGET=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
CARRY_LIMIT=$((64 * 1024 * 1024))
SITE=/tmp/codecport-site
PARTS=/tmp/codecport-parts
# Seconds after which the device check starts no further folder: the tiny folders take seconds,
# so this only bites when something hangs, and the call still ends inside the issue's 5 minutes.
DEADLINE=${GPU_CHECK_DEADLINE:-200}
# device-full exports every registered codec's default preset unless GPU_CHECK_FULL_CODECS names
# some ("dac mimi snac": NeuCodec's and XCodec2's w2v-BERT alone would take the budget).
# More arguments for gpu_check.py check, e.g. "--device-provider cpu" to try a device half here,
# or "--provider-option use_tf32=0".
read -r -a CHECK_ARGS <<<"${GPU_CHECK_ARGS:-}"
PIP_INSTALL=(python3 -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile
             --no-cache-dir --upgrade --target "$SITE")

exclude() {  # keep a staging folder out of git: it travels as a carried path instead
    local file
    file=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$file")"
    grep -qxF "/$1/" "$file" 2>/dev/null || echo "/$1/" >>"$file"
}

export_tiny() {  # codec precision out_dir: a small export of the codec, with seeded random weights
    local codec=$1 precision=$2 out=$3 args
    # The codec's own small export with every graph (its registration's `smoke` arguments).
    read -r -a args <<<"$(python3 -c 'import sys; from codecport import registry
print(" ".join(registry.get(sys.argv[1]).smoke))' "$codec")"
    rm -rf "$out"
    # --precision fp16: fp16 graphs with fp32 inputs/outputs, built from the validated fp32 ones.
    # fp32 adds batch-8 encoders (corpus tokenizing): each row is checked against batch 1.
    local batch=() batchable
    batchable=$(python3 -c 'import sys; from codecport import registry
print(1 if registry.get(sys.argv[1]).runtime.batchable else "")' "$codec")
    [ "$precision" = fp32 ] && [ -n "$batchable" ] && batch=(--batch 8)
    codec-export "$codec" "${args[@]}" "${batch[@]}" --random-init --target cuda --precision "$precision" -o "$out"
}

carried_bytes() {  # what one `run` sends: tracked and untracked-not-ignored files, plus $@
    {
        git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null
        find "$@" -type f -exec stat -c %s {} +
    } | awk '{s += $1} END {print s + 0}'
}

mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }

prepare() {
    if ! command -v codec-export >/dev/null; then
        echo "codec-export not found: pip install -e '.[export]'" >&2
        exit 1
    fi
    exclude "$STAGE"
    exclude "$FULL_STAGE"
    mkdir -p "$STAGE/models" "$STAGE/whl" "$STAGE/ort" "$FULL_STAGE/whl" "$CACHE"

    # The tiny presets: the real architectures at toy width, so the graphs hold every op the
    # full ones do, and the four folders weigh 2 MiB. A full preset is 0.3-0.7 GB a folder, ten
    # times the carry limit: device-full exports those on the device instead.
    for codec in $(python3 -c 'from codecport import registry; print(*registry.names())'); do
        for precision in fp32 fp16; do
            export_tiny "$codec" "$precision" "$STAGE/models/$codec-tiny-$precision"
        done
    done

    python3 -m pip download -q "${PIP_TARGET[@]}" -d "$CACHE" "$ORT_GPU"
    python3 -m pip download -q "${PIP_TARGET[@]}" -d "$STAGE/whl" "${WHEELS[@]}"
    python3 -m pip download -q "${PIP_TARGET[@]}" -d "$FULL_STAGE/whl" "${FULL_WHEELS[@]}"
    local wheel packed
    wheel=$(ls "$CACHE"/onnxruntime_gpu-"${ORT_GPU#*==}"-cp312-*.whl)
    packed=$STAGE/ort/$(basename "${wheel%.whl}")-sm90.tar.xz
    # The wheel is 256 MB, three quarters of it kernels for GPUs other than the H200's sm_90.
    if [ ! -f "$packed" ] || [ "$wheel" -nt "$packed" ] || [ scripts/gpu_check.py -nt "$packed" ]; then
        rm -f "$STAGE"/ort/*.tar.xz
        python3 scripts/gpu_check.py pack-ort "$wheel" "$packed" --arch 90
    fi

    # The first call carries the packed runtime; the tiny folders that do not fit beside it (the
    # last registered codecs' first) travel with the second call, which checks them first.
    rm -rf "$FULL_STAGE/models"
    mkdir -p "$FULL_STAGE/models"
    local codec
    for codec in $(python3 -c 'from codecport import registry; print(*reversed(registry.names()))'); do
        [ "$(carried_bytes "$STAGE")" -gt "$CARRY_LIMIT" ] || break
        mv "$STAGE/models/$codec"-tiny-* "$FULL_STAGE/models/"
    done
    rmdir "$FULL_STAGE/models" 2>/dev/null || true

    # The device half's Python, dry-run on this machine's CPU: CPU against CPU, identical.
    python3 scripts/gpu_check.py check "$STAGE"/models/* "$FULL_STAGE"/models/* --device-provider cpu \
        --runs 2 --steps 10 --json "$CACHE/dry_run.json"

    local main full
    main=$(carried_bytes "$STAGE")
    full=$(carried_bytes "$FULL_STAGE")
    du -sh "$STAGE"/models/* "$STAGE"/ort/* "$STAGE"/whl "$FULL_STAGE"/whl
    echo "carried by the device call: $(mib "$main") MiB of $((CARRY_LIMIT / 1048576))" \
         "(working tree + $STAGE/)"
    echo "carried by the device-full call: $(mib "$full") MiB (working tree + $FULL_STAGE/)"
    if [ "$main" -gt "$CARRY_LIMIT" ]; then
        echo "over the carry limit: the device call would be refused" >&2
        exit 1
    fi
    cat <<EOF

On a session lent the GPU machine (the device tool), one call:
  run(command="bash scripts/gpu_check.sh device", carry=["$STAGE"], timeout_s=300)
then at once, while the machine is still warm (30 s), the real-size presets:
  run(command="bash scripts/gpu_check.sh device-full", carry=["$FULL_STAGE"], timeout_s=360)
Each leaves its JSON and log in \$OUT; record the numbers in docs/gpu.md.
EOF
}

unpack_ort() {  # onnxruntime-gpu into $SITE: the whole wheel where device-part staged it, else the pack
    local wheel staged count
    if [ -f "$PARTS/SHA256SUMS" ]; then
        wheel=$(awk '{print $2}' "$PARTS/SHA256SUMS")
        staged=$(find "$PARTS" -name 'part-*' | wc -l)
        count=$(cat "$PARTS/COUNT")
        if [ "$staged" = "$count" ]; then
            cat "$PARTS"/part-* >"$PARTS/$wheel"
            (cd "$PARTS" && sha256sum -c --quiet SHA256SUMS)
            echo "onnxruntime-gpu: the whole wheel, from $count staged parts"
            "${PIP_INSTALL[@]}" "$PARTS/$wheel"
            return
        fi
        echo "only $staged of $count wheel parts staged: using the sm_90 pack"
    fi
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
        "$(ls "$STAGE"/ort/*.tar.xz)" "$SITE"
}

device() {
    export PYTHONUNBUFFERED=1
    local out=${OUT:-$STAGE/out} rc=0
    mkdir -p "$out" "$SITE"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    unpack_ort
    "${PIP_INSTALL[@]}" "$STAGE"/whl/*.whl
    # Ours ahead of the image's own onnxruntime, which is the CPU-only build.
    export PYTHONPATH=$SITE:$PWD
    python3 scripts/gpu_check.py check "$STAGE"/models/* --deadline "$DEADLINE" "${CHECK_ARGS[@]}" \
        --json "$out/gpu_check.json" 2>&1 | tee "$out/gpu_check.log" || rc=$?
    if [ "$rc" = 2 ] && command -v cuobjdump >/dev/null; then
        # The CUDA EP did not run: whether the cut library still holds sm_90 kernels.
        cuobjdump --list-elf "$SITE/onnxruntime/capi/libonnxruntime_providers_cuda.so" 2>&1 |
            grep -o 'sm_[0-9]*a\?' | sort | uniq -c || true
    fi
    return "$rc"
}

device_full() {
    export PYTHONUNBUFFERED=1
    # 290 s: with the machine already warm from `device`, the call ends inside 5 minutes; a slow
    # machine's exports may need GPU_CHECK_FULL_BUDGET=500.
    local out=${OUT:-$FULL_STAGE/out} work=/tmp/codecport-full budget=${GPU_CHECK_FULL_BUDGET:-290}
    if [ ! -d "$SITE/onnxruntime" ]; then
        echo "no $SITE/onnxruntime: this machine has not run 'device' (it went cold between the" \
             "calls, and a fresh one starts bare); run 'device' again first" >&2
        exit 3
    fi
    mkdir -p "$out" "$work"
    "${PIP_INSTALL[@]}" "$FULL_STAGE"/whl/*.whl
    export PYTHONPATH=$SITE:$PWD
    # Seconds of the budget left after keeping $1 back; never 0, which `timeout` reads as no limit.
    left() { local s=$((budget - SECONDS - ${1:-0})); echo $((s > 1 ? s : 1)); }
    local export_cli="import sys; from codecport.cli import export_cli; sys.argv[0] = 'codec-export'; \
export_cli()"
    local build="import sys; from pathlib import Path; from codecport import registry; from codecport.export.builds \
import Build, build_of_folder; src = Path(sys.argv[1]); \
build_of_folder(registry.codec_of_folder(src), src, Path(sys.argv[2]), Build('cuda', 'fp16'))"
    {
        if compgen -G "$FULL_STAGE/models/*/manifest.json" >/dev/null; then
            echo "== the tiny folders that did not fit the first call"
            python3 scripts/gpu_check.py check "$FULL_STAGE"/models/* --deadline 60 "${CHECK_ARGS[@]}" \
                --json "$out/gpu_check_tiny2.json" || echo "tiny folders: exit $?"
        fi
        # Seeded random weights: speed does not depend on their values. Each registered codec's
        # default preset at 1 s per call keeps the exports (every graph validated against torch
        # on the CPU) inside the budget: on the 2-core dev machine DAC-44k took 38 s, its fp16
        # build 128 s, Mimi 26 s. Codecs with batched encoders get them at batch 8.
        local name preset rate batch
        while read -r name preset rate batch; do
            timeout "$(left)" python3 -c "$export_cli" "$name" --preset "$preset" --len "$rate" \
                $batch --random-init --target cuda -o "$work/$name-$preset-fp32" ||
                echo "$name export failed or ran out of time"
        done < <(python3 -c 'import os; from codecport import registry
only = os.environ.get("GPU_CHECK_FULL_CODECS", "").split()
for c in registry.codecs():
    if not only or c.name in only:
        print(c.name, c.default_preset, c.presets[c.default_preset].sample_rate, "--batch=8" if c.runtime.batchable else "")')
        # fp16 from the fp32 folders without a second trace (as codec-bench --precision does),
        # keeping 120 s for the checks.
        local fp32
        for fp32 in "$work"/*-fp32; do
            [ -f "$fp32/manifest.json" ] || continue
            timeout "$(left 120)" python3 -c "$build" "$fp32" "${fp32%-fp32}-fp16" ||
                echo "$(basename "$fp32") fp16 build failed or ran out of time"
        done
        local folders
        folders=$(find "$work" -mindepth 2 -maxdepth 2 -name manifest.json -printf '%h\n' | sort)
        [ -n "$folders" ] || { echo "no folder exported: nothing to check"; exit 1; }
        # At least 30 s, so the first folder starts even when the exports ate the budget.
        # shellcheck disable=SC2086  # one folder per word
        python3 scripts/gpu_check.py check $folders --runs 5 --steps 100 "${CHECK_ARGS[@]}" \
            --deadline "$(( $(left 40) > 30 ? $(left 40) : 30 ))" --json "$out/gpu_check_full.json" ||
            echo "check: exit $?"
        # On 2026-12-04 TF32 (ORT's default) left Mimi's fixed encoder at 93 % of the CPU's codes:
        # the fp32 folders once more with it off tell TF32 from a kernel difference (30 s).
        local strict
        strict=$(find "$work" -mindepth 1 -maxdepth 1 -name '*-fp32' -printf '%p\n' | sort)
        if [ -n "$strict" ] && [ "$(left)" -gt 30 ]; then
            echo "== the fp32 folders with use_tf32=0"
            # shellcheck disable=SC2086  # one folder per word
            python3 scripts/gpu_check.py check $strict --runs 3 --steps 30 "${CHECK_ARGS[@]}" \
                --provider-option use_tf32=0 --deadline "$(left)" --json "$out/gpu_check_full_tf32_off.json" ||
                echo "check without TF32: exit $?"
        fi
    } 2>&1 | tee "$out/gpu_check_full.log"
}

device_serve() {  # codec-bench serve --provider cuda, each streaming codec, inside one budget
    export PYTHONUNBUFFERED=1
    local out=${OUT:-$FULL_STAGE/out} budget=${GPU_CHECK_SERVE_BUDGET:-300} site
    local provider=${GPU_CHECK_SERVE_PROVIDER:-cuda}  # cpu: a dry run here
    if [ ! -d "$SITE/onnxruntime" ]; then
        echo "no $SITE/onnxruntime: run 'device' first, on the same warm machine" >&2
        exit 3
    fi
    mkdir -p "$out"
    export PYTHONPATH=$SITE:$PWD
    python3 -c 'import onnxsim' 2>/dev/null || "${PIP_INSTALL[@]}" "$FULL_STAGE"/whl/*.whl
    # codec-serve's processes import no torch, and onnxruntime-gpu in $SITE finds no nvidia-* pip
    # packages beside it: the image's CUDA and cuDNN libraries go on the loader's path, as a
    # system install would be (what a user without torch has).
    site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    LD_LIBRARY_PATH=$( (find "$site/nvidia" -name 'lib*.so*' -printf '%h\n' 2>/dev/null || true) | sort -u | paste -sd:)
    export LD_LIBRARY_PATH
    local bench="import sys; from codecport.bench.cli import main; sys.argv[0] = 'codec-bench'; main()"
    {
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
        # By default B=1 (one step per stream) against the slot graphs of 32 streams a call, fp32
        # only (the fp16 build alone took 2.5 minutes of the dry run on the CPU), a short trial
        # each, ramps to 128 streams.
        local codec codecs share args
        read -r -a args <<<"${GPU_CHECK_SERVE_ARGS:---slots 1 --slots 32 --precision fp32 --seconds 3 --max-streams 128}"
        # GPU_CHECK_SERVE_CODECS: which, in order; the first gets 60 % of the budget when others
        # follow. On 2026-12-04 SNAC's run took 79 s with its export made before; Mimi's export
        # with 32-stream slot graphs and two servers took more than 168 s.
        read -r -a codecs <<<"${GPU_CHECK_SERVE_CODECS:-mimi snac}"
        for codec in "${codecs[@]}"; do
            if [ "$codec" = "${codecs[0]}" ] && [ "${#codecs[@]}" -gt 1 ]; then
                share=$((budget * 6 / 10))
            else
                share=$((budget - SECONDS - 5))
            fi
            [ "$share" -gt 20 ] || { echo "$codec: no time left"; continue; }
            echo "== codec-bench serve $codec ${args[*]} --provider $provider (${share} s at most)"
            timeout -s TERM "$share" python3 -c "$bench" serve "$codec" "${args[@]}" --provider "$provider" \
                --dir "/tmp/serve-$codec" --json "$out/bench-serve-$codec-$provider.json" ||
                echo "$codec: codec-bench serve exit $? (124: out of time)"
        done
    } 2>&1 | tee "$out/gpu_serve.log"
}

prepare_split() {  # fallback: the whole wheel in parts, one part carried per call (docs/gpu.md)
    local wheel n part dir
    wheel=$(ls "$CACHE"/onnxruntime_gpu-"${ORT_GPU#*==}"-cp312-*.whl)
    rm -rf .gpu-part* "$CACHE/split"
    mkdir -p "$CACHE/split"
    split -b 60M -d -a 1 "$wheel" "$CACHE/split/part-"
    n=$(find "$CACHE/split" -name 'part-*' | wc -l)
    echo "On the device, one call per part, back to back (the machine stays warm 30 s after each):"
    for part in "$CACHE"/split/part-*; do
        dir=.gpu-part${part##*-}
        exclude "$dir"
        mkdir -p "$dir"
        cp "$part" "$dir/"
        (cd "$(dirname "$wheel")" && sha256sum "$(basename "$wheel")") >"$dir/SHA256SUMS"
        echo "$n" >"$dir/COUNT"
        echo "  run(command=\"bash scripts/gpu_check.sh device-part ${part##*-}\"," \
             "carry=[\"$dir\"], timeout_s=60)"
    done
    echo "then the device call prepare printed: it installs the whole wheel instead of the sm_90 pack."
}

device_part() {  # stage carried part $1 where the device call looks for it
    mkdir -p "$PARTS"
    cp ".gpu-part$1"/part-* ".gpu-part$1"/SHA256SUMS ".gpu-part$1"/COUNT "$PARTS/"
    echo "staged part $1: $(find "$PARTS" -name 'part-*' | wc -l) of $(cat "$PARTS/COUNT")"
}

case "${1:-prepare}" in
    prepare) prepare ;;
    prepare-split) prepare_split ;;
    device) device ;;
    device-full) device_full ;;
    device-serve) device_serve ;;
    device-part) device_part "${2:?device-part N}" ;;
    *) echo "usage: $0 [prepare|prepare-split|device|device-full|device-serve|device-part N]" >&2; exit 2 ;;
esac
