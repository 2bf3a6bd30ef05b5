"""`vkllm tune -m FILE`: times every candidate mat-vec shape for each distinct weight of a model
(each feed-forward gate through the fused gate+up kernel too, and each residual weight writing
the next norm's input where decode has it do so) on this device, caches the fastest
(as loading the model would, see worker/engine/kernels/tuning.py)
and prints the tables, so a GPU run shows what was chosen and what it gains over the fixed
shape. It always measures, replacing what the cache held for those weights."""
from worker.engine.config import Settings


def register(sub):
    p = sub.add_parser("tune", help="measure and cache the mat-vec workgroup shapes of a model's weights")
    p.add_argument("-m", "--model", required=True, help="GGUF file")
    p.set_defaults(func=run)


def run(args):
    from worker.engine.kernels.mat_vec import mat_vec_shape
    from worker.engine.kernels.tuning import MatVecTuner, shape_label
    from worker.engine.modelfile import ModelFile
    from worker.engine.models.model import glu_keys, mat_vec_keys, residual_keys
    from worker.engine.vk.context import Context
    from worker.engine.weight_types import row_bytes
    settings = Settings.from_env()
    model_file = ModelFile.open(args.model)
    ctx = Context(settings)
    try:
        tuner, fixed = MatVecTuner(ctx, settings.cache_dir), mat_vec_shape(ctx)
        keys = [(key, False, False) for key in sorted(mat_vec_keys(model_file))] + \
               [(key, True, False) for key in sorted(glu_keys(model_file))] + \
               [(key, False, True) for key in sorted(residual_keys(model_file)) if tuner.times_norm_blocks(key)]
        print(f"device: {ctx.info.describe()}; fixed shape {shape_label(fixed)} (threads x rows[/lanes]); "
              f"{len(keys)} distinct weights and kernels")
        for (qtype, rows, cols), glu, residual in keys:
            table = tuner.measure((qtype, rows, cols), glu, residual=residual)
            tuner.store({(qtype, rows, cols): table}, glu, residual)
            nbytes, best = rows * row_bytes(qtype, cols) * (2 if glu else 1), min(table, key=table.get)
            gain = f", {table[fixed] / table[best]:.2f}x the fixed shape" if fixed in table else ""
            kernel = "gate+up " if glu else "residual, next norm's blocks " if residual else ""
            print(f"{kernel}{qtype.name} {rows} x {cols} ({nbytes / 1e6:.1f} MB): {shape_label(best)}{gain}")
            for shape, seconds in sorted(table.items(), key=lambda item: item[1]):
                marks = [label for label, s in (("chosen", best), ("fixed", fixed)) if s == shape]
                print(f"  {shape_label(shape):>11} {seconds * 1e6:10.1f} us {nbytes / seconds / 1e9:9.1f} GB/s "
                      f"{' '.join(marks)}".rstrip(), flush=True)
        print(f"cached in {tuner.path}")
    finally:
        ctx.close()
