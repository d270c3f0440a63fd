#!/usr/bin/env bash
# The GPU backend for an NVIDIA machine with no network and no CUDA 11 (only a driver, and a CUDA 12 or 13 with its
# cuBLAS), in pieces small enough to carry: what `npm run bench -- gpu` measured on an H100 with (README, bench gpu).
#
#   bash scripts/gpu_offline.sh pack DIR [PART_MB]   # here, online, after `npm run build` and `npm run native`
#   eval "$(bash scripts/gpu_offline.sh stage DIR)"  # there, from the repo root: unpacks, sets LD_LIBRARY_PATH, NODE…
#
# pack writes DIR/part-1, DIR/part-2, … (each at most PART_MB, default 55) holding: libtensorflow 2.10.1's GPU build
# from Maven Central, with every cubin but Hopper's and the relocatable device code zeroed
# (scripts/fatbin_prune.py) and stripped, then xz (970 MB → 92 MB); CUDA 11.8's runtime from its PyPI wheel; empty
# stand-ins for cuDNN 8, cuFFT, cuRAND, cuSOLVER and cuSPARSE (libtensorflow loads them at start; the model's ops
# call none of them); this Node binary; dist/ and node_modules/ without the dev tools, with @tensorflow/tfjs-node-gpu
# in place of @tensorflow/tfjs-node (same binding). stage unpacks them all (from DIR, or from DIR/part-* wherever
# each came), links the machine's cuBLAS (libcublas.so.1N, libcublasLt.so.1N) under cuBLAS 11's names, and checks
# that TensorFlow made a GPU device. Then, with the printed exports:
#   "$NODE" --expose-gc dist/bench/run.js gpu --no-build
# The first use of each kernel compiles libtensorflow's compute_80 PTX for the GPU (10–20 s for the bench's ops).
set -euo pipefail
cd "$(dirname "$0")/.."

TF_JAVA_VERSION=0.5.0
cache=${RXRL_NATIVE_CACHE:-$HOME/.cache/rxrl-native}
gpu_pkg=@tensorflow/tfjs-node-gpu
work=''
stubs=(libcudnn.so.8 libcufft.so.10 libcurand.so.10 libcusolver.so.11 libcusparse.so.11)

unxz_to() { if command -v xz >/dev/null; then xz -dc -T0 "$1"; else python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer, 1 << 24)' "$1"; fi; }

# pack: the libraries (libtensorflow pruned, cudart, stand-ins) into $1/lib.
pack_libs() {
  local out=$1 work=$2 jar="$cache/tensorflow-core-api-$TF_JAVA_VERSION-linux-x86_64-gpu.jar"
  [ -s "$jar" ] || mvn -q dependency:copy -Dartifact="org.tensorflow:tensorflow-core-api:$TF_JAVA_VERSION:jar:linux-x86_64-gpu" -DoutputDirectory="$cache"
  unzip -o -q -j -d "$work" "$jar" '*/libtensorflow_cc.so.2' '*/libtensorflow_framework.so.2'
  python3 scripts/fatbin_prune.py "$work/libtensorflow_cc.so.2" "$work/cc.so" >&2
  strip -o "$work/libtensorflow_cc.so.2" "$work/cc.so" && strip "$work/libtensorflow_framework.so.2" && rm "$work/cc.so"
  mkdir -p "$out/lib"
  xz -T0 -6 -c "$work/libtensorflow_cc.so.2" > "$out/lib/libtensorflow_cc.so.2.xz"
  xz -T0 -6 -c "$work/libtensorflow_framework.so.2" > "$out/lib/libtensorflow_framework.so.2.xz"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$work" "$(grep '^nvidia-cuda-runtime-cu11==' scripts/requirements-cuda11.txt)"
  unzip -o -q -j -d "$out/lib" "$work"/nvidia_cuda_runtime_cu11-*.whl '*/libcudart.so.11.0'
  local so
  for so in "${stubs[@]}"; do
    printf 'int rxrl_absent_%s(void) { return 0; }\n' "${so%%.*}" > "$work/stub.c"
    [ "${so%%.*}" = libcudnn ] && echo 'unsigned long cudnnGetVersion(void) { return 8906; }' >> "$work/stub.c"
    gcc -shared -fPIC -O2 -Wl,-soname,"$so" -o "$out/lib/$so" "$work/stub.c"
  done
}

# pack: Node, dist/ and the runtime node_modules into $1.
pack_js() {
  local out=$1 work=$2 version binding
  version=$(node -p "require('@tensorflow/tfjs-core/package.json').version")
  binding=$(ls node_modules/@tensorflow/tfjs-node/lib/napi-v*/tfjs_binding.node 2>/dev/null | head -n 1 || true)
  [ -n "$binding" ] || { echo "gpu_offline: run \`npm run native\` first (its compiled binding is reused)" >&2; exit 1; }
  xz -T0 -9 -c "$(command -v node)" > "$out/node.xz"
  (cd "$work" && npm pack -q "$gpu_pkg@$version" >/dev/null && mkdir -p gpu && tar -xzf tensorflow-tfjs-node-gpu-*.tgz -C gpu)
  mkdir -p "$work/gpu/package/$(dirname "${binding#node_modules/@tensorflow/tfjs-node/}")"
  cp "$binding" "$work/gpu/package/${binding#node_modules/@tensorflow/tfjs-node/}"
  tar -cf "$work/js.tar" --exclude='node_modules/@tensorflow/tfjs-node' --exclude='node_modules/.cache' \
    --exclude='node_modules/typescript' --exclude='node_modules/eslint*' --exclude='node_modules/@eslint*' \
    --exclude='node_modules/prettier' --exclude='node_modules/vite' --exclude='node_modules/vitest' \
    --exclude='node_modules/@vitest' --exclude='node_modules/@rolldown' --exclude='node_modules/rolldown' \
    --exclude='node_modules/lightningcss*' --exclude='node_modules/@typescript-eslint' --exclude='node_modules/@types' \
    --exclude='node_modules/esbuild' --exclude='node_modules/@esbuild' dist node_modules
  tar -rf "$work/js.tar" -C "$work/gpu" --transform "s,^package,node_modules/$gpu_pkg," package
  xz -T0 -9 -c "$work/js.tar" > "$out/js.tar.xz"
}

pack() {
  local dir=$1 part_mb=${2:-55}
  [ -f dist/bench/run.js ] || { echo 'gpu_offline: run `npm run build` first' >&2; exit 1; }
  work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/out" && pack_libs "$work/out" "$work" && pack_js "$work/out" "$work"
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$work/out" && tar -cf - .) | split -b "${part_mb}m" -d -a 1 - "$dir/piece."
  local i=1 piece
  for piece in "$dir"/piece.*; do mkdir -p "$dir/part-$i" && mv "$piece" "$dir/part-$i/" && i=$((i + 1)); done
  du -sh "$dir"/part-* >&2
}

stage() {
  local dir=$1 lib="$PWD/node_modules/$gpu_pkg/deps/lib" work=/tmp/rxrl-gpu name found
  mkdir -p "$work"
  local i
  for i in 0 1 2 3 4 5 6 7 8 9; do cat "$dir"/piece."$i" "$dir"/part-*/piece."$i" 2>/dev/null || true; done | tar -xf - -C "$work"
  unxz_to "$work/node.xz" > "$work/node" && chmod +x "$work/node"
  unxz_to "$work/js.tar.xz" | tar -xf -
  mkdir -p "$lib"
  for name in libtensorflow_cc.so.2 libtensorflow_framework.so.2; do unxz_to "$work/lib/$name.xz" > "$lib/$name"; done
  chmod 755 "$lib"/*.so.2
  for name in libcudart.so.11.0 "${stubs[@]}"; do cp "$work/lib/$name" "$lib/"; done
  ln -sf libtensorflow_cc.so.2 "$lib/libtensorflow.so.2" && ln -sf libtensorflow_cc.so.2 "$lib/libtensorflow.so"
  ln -sf libtensorflow_framework.so.2 "$lib/libtensorflow_framework.so"
  for name in libcublas libcublasLt; do
    found=$(find /usr/local /usr/lib /usr/lib64 /opt -name "$name.so.1[0-9]*" 2>/dev/null | sort | tail -n 1)
    if [ -n "$found" ]; then ln -sf "$found" "$lib/$name.so.11"; else echo "gpu_offline: no $name.so.1N here" >&2; fi
  done
  local env="export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} NODE=$work/node"
  env+=" CUDA_MODULE_LOADING=LAZY CUDA_CACHE_MAXSIZE=4294967296 TF_FORCE_GPU_ALLOW_GROWTH=true"
  eval "$env"
  "$NODE" --input-type=module -e "const tf = await import('$gpu_pkg'); await tf.matMul(tf.ones([64, 64]), tf.ones([64, 64])).data();" \
    2>&1 | grep -E 'Created device|Could not load' >&2 || echo 'gpu_offline: TensorFlow made no GPU device' >&2
  echo "$env"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  stage) shift; stage "$@" ;;
  *) echo 'usage: bash scripts/gpu_offline.sh pack DIR [PART_MB] | stage DIR' >&2; exit 2 ;;
esac
