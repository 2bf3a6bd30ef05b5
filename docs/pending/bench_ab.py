"""python3 docs/pending/bench_ab.py plain|items <vkllm args...>: the CLI with the items kernel off (plain) or as the engine chooses (docs/pending/coopmat_items.patch applied)."""
import sys
import worker.engine.kernels.matmul as mm
import worker.engine.kernels.coopmat as cm
if sys.argv[1] == "plain":
    mm.coopmat_kernel = lambda info, w, n: (cm.coopmat_tile(info, w, n), 0)
sys.argv = ["vkllm"] + sys.argv[2:]
from vkllm.cli import main
sys.exit(main())
