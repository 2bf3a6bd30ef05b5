# The GPU run of docs/pending (see README.md), on the device from the repository root, the patch
# applied in the tree that travels and HEAD's shader in .device/exp/coopmat.head:
#   git show HEAD:shaders/mul_mat_coopmat.comp > .device/exp/coopmat.head
#   git apply docs/pending/items_f16.patch
# then the device's command: bash docs/pending/ab.sh (carry .device). Up to about 480 s (the last part, the sweep, is cut at 150).
source .device/env.sh
export XDG_CACHE_HOME=/tmp/xdg VKLLM_TEST_NO_VALIDATION=1
mkdir -p /tmp/xdg/vkllm; cp .device/cache/*.json /tmp/xdg/vkllm/ 2>/dev/null; chmod u+w /tmp/xdg/vkllm/* 2>/dev/null
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
(OMP_NUM_THREADS=4 nice -n 19 python3 -m vkllm.cli models synth llama-3.1-8b /tmp/8b.gguf > $OUT/synth.log 2>&1) &
cp shaders/mul_mat_coopmat.comp /tmp/coopmat.new
# nodeq (timing only, wrong values): the store writes the quant words as they are, the bound on
# what any dequantization arithmetic can gain
sed 's/return uvec2(packFloat2x16(fma(even, a, b)), packFloat2x16(fma(odd, a, b)));/return uvec2(q, q >> 8);/' \
    /tmp/coopmat.new > /tmp/coopmat.nodeq
arm() { case $1 in head) cp .device/exp/coopmat.head shaders/mul_mat_coopmat.comp;; *) cp /tmp/coopmat.$1 shaders/mul_mat_coopmat.comp;; esac; }
for a in head new nodeq; do
  arm $a; echo "## $a"; timeout 60 python3 docs/pending/diag_items.py 8,16,32 --nosweep 2>&1 | grep "==\|rror"
done | tee $OUT/kernels.log
arm new
timeout 60 python3 -m pytest -q -x tests/test_kernels_matmul.py tests/test_kernels_matmul_norm.py -k coopmat 2>&1 | tail -2
wait
for a in new head; do
  arm $a; echo "## $a"
  timeout 75 python3 -m vkllm.cli bench -m /tmp/8b.gguf -p 64 -n 256 -r 1 --batch 1,8,32 2>&1 | tail -3
done | tee $OUT/ab.log
arm new
timeout 60 python3 -m vkllm.cli bench -m /tmp/8b.gguf -p 64 -n 32 -r 1 --batch 8,32 --profile > $OUT/profile.log 2>&1
timeout 150 python3 docs/pending/diag_items.py 8,16,32 2>&1 | grep -v "^   (" > $OUT/sweep.log
