#!/usr/bin/env bash
# Installs the native TensorFlow backend (@tensorflow/tfjs-node, or @tensorflow/tfjs-node-gpu with --gpu) without
# its installer's download host: libtensorflow comes from Maven Central (org.tensorflow:tensorflow-core-api, whose
# libtensorflow_cc.so.2 exports the C API the binding calls), the C headers from the tensorflow-cpu wheel on PyPI,
# and the addon is compiled here against them. Idempotent; downloads are cached in $RXRL_NATIVE_CACHE
# (default ~/.cache/rxrl-native). The package is installed with --no-save: package.json and the lockfile are
# untouched, and the embedded default stays wasm.
#
#   npm run native            # CPU
#   npm run native -- --gpu   # CUDA 11.2 / cuDNN 8.1 (what libtensorflow 2.10 was built against)
set -euo pipefail
cd "$(dirname "$0")/.."

gpu=false
for arg in "$@"; do
  case "$arg" in
    --gpu) gpu=true ;;
    *) echo "native: unknown argument '$arg' (use --gpu or nothing)" >&2; exit 2 ;;
  esac
done

TF_JAVA_VERSION=0.5.0      # libtensorflow 2.10.1
TF_HEADERS_VERSION=2.9.1   # C API headers (unchanged in 2.10)
tfjs_version=$(node -p "require('@tensorflow/tfjs-core/package.json').version")
if $gpu; then
  pkg=@tensorflow/tfjs-node-gpu
  classifier=linux-x86_64-gpu
else
  pkg=@tensorflow/tfjs-node
  classifier=linux-x86_64
fi
cache=${RXRL_NATIVE_CACHE:-$HOME/.cache/rxrl-native}
mkdir -p "$cache"
started=$(date +%s)

# Its tools: Maven (and Java) for the jar, pip for the wheel, make and g++ for the addon. As root, the missing ones
# are installed from Debian's packages; otherwise the command that would is named.
missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "native: needs ${missing[*]} (run: sudo apt-get install -y ${missing[*]})" >&2
    exit 1
  fi
  echo "native: apt-get install ${missing[*]}" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" </dev/null >/dev/null
fi
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "native: Maven Central has libtensorflow for linux-x86_64 only; this is $(uname -s)-$(uname -m)" >&2
  exit 1
fi
# CUDA 11 and cuDNN 8 for --gpu: the system's when the loader finds both (ldconfig or LD_LIBRARY_PATH), else
# NVIDIA's PyPI wheels (scripts/requirements-cuda11.txt) in $cache/cuda11, linked into deps/lib in step 4, where
# libtensorflow looks first (its RUNPATH is $ORIGIN/). Only the driver (libcuda.so.1) must come from the system.
loader_has() {
  ldconfig -p 2>/dev/null | grep -q "$1" && return 0
  local d
  for d in ${LD_LIBRARY_PATH:+${LD_LIBRARY_PATH//:/ }}; do [ -e "$d/$1" ] && return 0; done
  return 1
}
cuda_libs=()
if $gpu && ! { loader_has libcudart.so.11.0 && loader_has libcudnn.so.8; }; then
  wheels="$cache/cuda11"
  if ! cmp -s scripts/requirements-cuda11.txt "$wheels/.requirements"; then
    echo "native: installing CUDA 11 / cuDNN 8 from PyPI into $wheels (about 2.8 GB)" >&2
    rm -rf "$wheels"
    python3 -m pip install --quiet --no-deps --only-binary=:all: --target "$wheels" -r scripts/requirements-cuda11.txt >&2
    cp scripts/requirements-cuda11.txt "$wheels/.requirements"
  fi
  cuda_libs=("$wheels"/nvidia/*/lib/lib*.so*)
fi
if $gpu && ! loader_has libcuda.so.1; then
  echo "native: no NVIDIA driver (libcuda.so.1) on this machine: the GPU build installs, and computes on the CPU" >&2
fi

# 1. libtensorflow from Maven Central.
jar="$cache/tensorflow-core-api-$TF_JAVA_VERSION-$classifier.jar"
if [ ! -s "$jar" ]; then
  echo "native: fetching org.tensorflow:tensorflow-core-api:$TF_JAVA_VERSION:$classifier from Maven Central" >&2
  mvn -q dependency:copy -Dartifact="org.tensorflow:tensorflow-core-api:$TF_JAVA_VERSION:jar:$classifier" \
    -DoutputDirectory="$cache" >&2
fi

# 2. The C headers from the PyPI wheel (only tensorflow/c and the two ctstring headers it includes).
headers="$cache/include-$TF_HEADERS_VERSION"
if [ ! -f "$headers/tensorflow/c/c_api.h" ]; then
  echo "native: fetching the tensorflow-cpu $TF_HEADERS_VERSION wheel from PyPI for its C headers" >&2
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.10 --platform manylinux2014_x86_64 \
    "tensorflow-cpu==$TF_HEADERS_VERSION" -d "$cache" >&2
  wheel=$(ls "$cache"/tensorflow_cpu-"$TF_HEADERS_VERSION"-*.whl | head -n 1)
  rm -rf "$cache/wheel"
  python3 - "$wheel" "$cache/wheel" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith('tensorflow/include/tensorflow/c/') or name.startswith('tensorflow/include/tensorflow/core/platform/ctstring'):
            z.extract(name, out)
PY
  mkdir -p "$headers"
  cp -r "$cache/wheel/tensorflow/include/tensorflow" "$headers/"
  rm -rf "$cache/wheel" "$wheel"
fi

# 3. The package itself, without its install script (which would download libtensorflow).
dir="node_modules/$pkg"
if [ ! -f "$dir/package.json" ] || [ "$(node -p "require('./$dir/package.json').version")" != "$tfjs_version" ]; then
  echo "native: installing $pkg@$tfjs_version (--no-save --ignore-scripts)" >&2
  npm install --no-save --ignore-scripts --no-audit --no-fund "$pkg@$tfjs_version" >&2
fi

# 4. Stage deps/ as the binding expects (-ltensorflow -ltensorflow_framework, rpath $ORIGIN/../../deps/lib).
mkdir -p "$dir/deps/lib" "$dir/deps/include"
rm -rf "$dir/deps/include/tensorflow"
cp -r "$headers/tensorflow" "$dir/deps/include/"
if [ ! -f "$dir/deps/lib/libtensorflow_cc.so.2" ]; then
  (cd "$dir/deps/lib" && python3 - "$jar" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in z.namelist():
        base = os.path.basename(name)
        if base in ('libtensorflow_cc.so.2', 'libtensorflow_framework.so.2'):
            with z.open(name) as src, open(base, 'wb') as dst:
                dst.write(src.read())
            os.chmod(base, 0o755)
PY
  )
fi
ln -sf libtensorflow_cc.so.2 "$dir/deps/lib/libtensorflow.so"
ln -sf libtensorflow_cc.so.2 "$dir/deps/lib/libtensorflow.so.2"
ln -sf libtensorflow_framework.so.2 "$dir/deps/lib/libtensorflow_framework.so"
for lib in "${cuda_libs[@]}"; do ln -sf "$lib" "$dir/deps/lib/"; done

# 5. Compile the addon. node-gyp needs Node's headers and would download them; use the ones installed beside
#    node (Debian's nodejs ships /usr/include/node) unless npm's `nodedir` already names some.
node_prefix=$(node -p "require('path').resolve(process.execPath, '..', '..')")
if [ -z "${npm_config_nodedir:-}" ] && [ -f "$node_prefix/include/node/node_api.h" ]; then
  export npm_config_nodedir="$node_prefix"
fi
addon=$(ls "$dir"/lib/napi-v*/tfjs_binding.node 2>/dev/null | head -n 1 || true)
if [ -z "$addon" ]; then
  echo "native: compiling the tfjs-node binding" >&2
  (cd "$dir" && PATH="$PWD/../../.bin:$PATH" npx --no-install node-pre-gyp install --build-from-source >&2)
  addon=$(ls "$dir"/lib/napi-v*/tfjs_binding.node | head -n 1)
fi

# 6. Check: the backend loads and computes.
TF_CPP_MIN_LOG_LEVEL=2 node --input-type=module -e "
const tf = await import('$pkg');
const a = tf.tensor2d([[1, 2], [3, 4]]);
const sum = (await tf.matMul(a, a).sum().data())[0];
if (tf.getBackend() !== 'tensorflow' || sum !== 54) throw new Error('native backend check failed: ' + tf.getBackend() + ' ' + sum);
"
size=$(du -sh "$dir" | cut -f1)
echo "native: $pkg@$tfjs_version ready ($addon, $size installed, $(($(date +%s) - started)) s); initBackend('auto') now picks 'tensorflow'" >&2
