"""The few-column cooperative-matrix products (sessions 34 and 37): times each weight of the 8B's
batched decode at n columns (first argument, e.g. 8,16,32) through the plain coopmat kernel
(the engine's tile and splits), the items kernel as the engine picks it and, up to 16 columns,
the 8-bit mat-cols kernel; then, unless --nosweep, the items kernel over tiles x steps ahead.
--stats prints the NVIDIA compiler's statistics (registers, spills, shared memory) of each
pipeline. Run from the repository root on the GPU machine."""
import sys, itertools, time
from gguf import GGMLQuantizationType as T
from worker.engine.vk.loader import load_vulkan
vk = load_vulkan()
import worker.engine.vk.device as vkdevice
import worker.engine.vk.pipeline as vkpipe

STATS = "--stats" in sys.argv
if STATS:
    vkdevice._WANTED_DEVICE_EXTENSIONS = vkdevice._WANTED_DEVICE_EXTENSIONS + ("VK_KHR_pipeline_executable_properties",)
    _F2 = vk.VkPhysicalDeviceFeatures2
    def F2(*a, **kw):
        if kw.get("pNext") is not None:
            kw["pNext"] = vk.VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR(pNext=kw["pNext"], pipelineExecutableInfo=vk.VK_TRUE)
        return _F2(*a, **kw)
    vk.VkPhysicalDeviceFeatures2 = F2
    _CI = vk.VkComputePipelineCreateInfo
    def CI(*a, **kw):
        kw["flags"] = kw.get("flags", 0) | 0x40   # CAPTURE_STATISTICS
        return _CI(*a, **kw)
    vk.VkComputePipelineCreateInfo = CI

from worker.engine.config import Settings
from worker.engine.vk.context import Context
import worker.engine.kernels.matmul as mm
import worker.engine.kernels.coopmat as cm
from worker.tools.bench_cols import Copies

ctx = Context(Settings.from_env())
print(ctx.info.describe(), flush=True)
stats_fn = None
if STATS:
    try:
        stats_fn = vk.vkGetDeviceProcAddr(ctx.device, "vkGetPipelineExecutableStatisticsKHR")
    except Exception as e:
        print("no stats:", e)

def stats_of(kernel):
    if stats_fn is None:
        return ""
    try:
        out = []
        for s in stats_fn(ctx.device, vk.VkPipelineExecutableInfoKHR(pipeline=kernel.compute_pipeline, executableIndex=0)):
            name = s.name if isinstance(s.name, str) else vk.ffi.string(s.name).decode()
            f = s.format
            v = s.value.b32 if f == 0 else s.value.i64 if f == 1 else s.value.u64 if f == 2 else s.value.f64
            out.append(f"{name}={v}")
        return "; ".join(out)
    except Exception as e:
        return f"stats error {e!r}"

_kernel = ctx.kernel
seen = {}
def kernel(name, spec=None):
    k = _kernel(name, spec)
    key = (name, tuple(sorted((spec or {}).items())))
    if STATS and key not in seen:
        seen[key] = stats_of(k)
        print(f"   [{name} {dict(spec or {})}] {seen[key]}", flush=True)
    return k
ctx.kernel = kernel

_kernel_choice, _splits = mm.coopmat_kernel, mm.coopmat_splits
def configure(items, splits):
    mm.coopmat_kernel = (_kernel_choice if items == "engine" else (lambda info, w, n: items) if items
                         else (lambda info, w, n: (cm.coopmat_tile(info, w, n), 0)))
    mm.coopmat_splits = (lambda c, w, n, t, a=0: splits) if splits is not None else _splits

WEIGHTS = [("gate+up", T.Q4_K, 14336, 4096, True), ("down", T.Q4_K, 4096, 14336, False),
           ("down", T.Q6_K, 4096, 14336, False), ("qkv", T.Q4_K, 6144, 4096, False)]
NS = [int(a) for a in (sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else "16,32,64").split(",")]
SWEEP = "--nosweep" not in sys.argv
RUNS, WARM = 5, 0.1
TILES = {  # per n-bucket, items tiles to try (all within 48 KiB of shared memory; BK a multiple of 128 serves Q6_K too)
    16: [(128, 16, 16, 16, 128, 1), (64, 16, 16, 16, 128, 1), (64, 16, 16, 16, 256, 1), (128, 16, 32, 16, 128, 1), (32, 16, 16, 16, 256, 1)],
    32: [(128, 32, 32, 16, 128, 1), (64, 32, 16, 32, 128, 1), (64, 32, 16, 16, 128, 1), (32, 32, 16, 16, 256, 1), (32, 32, 16, 32, 256, 1), (128, 32, 32, 32, 128, 1)],
    64: [(64, 64, 32, 32, 128, 1), (64, 64, 16, 32, 128, 1), (32, 64, 16, 32, 128, 1), (64, 64, 32, 64, 128, 1)],
}
t0 = time.time()
for name, qt, rows, K, glu in WEIGHTS:
    with Copies(ctx, qt, rows, K, glu, 512 << 20, max(NS)) as w:
        for n in NS:
            configure(None, None)
            base = w.time(n, "coopmat", None, RUNS, WARM)
            configure("engine", None)
            eng = w.time(n, "coopmat", None, RUNS, WARM)
            cols = f", mat_cols_x8 {w.time(n, 'mat_cols_x8', None, RUNS, WARM)*1e6:.1f} us" if n <= 16 else ""
            print(f"== {name} {qt.name} {rows}x{K} n={n}: plain {base*1e6:.1f} us, items(engine default) {eng*1e6:.1f} us{cols}", flush=True)
            if not SWEEP:
                continue
            bucket = 16 if n <= 16 else 32 if n <= 32 else 64
            res = []
            for tile, ahead, splits in itertools.product(TILES[bucket], (1, 2), (None,)):
                if tile[4] % (64 if qt != T.Q6_K else 128):
                    continue
                if not cm.coopmat_tile_runs(ctx.info, tile):
                    print("   does not run:", tile); continue
                configure((tile, ahead), splits)
                try:
                    t = w.time(n, "coopmat", None, RUNS, WARM)
                except Exception as e:
                    print("   fail", tile, ahead, splits, e); continue
                res.append((t, tile, ahead, splits))
                print(f"   {tile} ahead {ahead} splits {splits or 'engine'}: {t*1e6:.1f}", flush=True)
            res.sort()
            print(f"   BEST {name} {qt.name} n={n}: " + "; ".join(f"{t*1e6:.1f} {tile} a{ah} s{sp or 'e'}" for t, tile, ah, sp in res[:4]), flush=True)
    print(f"[{time.time()-t0:.0f}s]", flush=True)
configure("engine", None)
