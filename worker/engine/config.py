"""Settings read once from the environment (VKLLM_*), then passed down explicitly."""
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from vkllm.errors import VkllmError
from worker.engine.kernels.paged import KV_TYPES

_TUNE = {"auto": None, "": None, "0": False, "1": True}
# Which kernel products of 2..16 columns (batched decode) take (kernels/paths.py `product_path`): auto,
# the default (the mat-cols kernel on GPUs, measured faster there: kernels/matmul.py
# MAT_COLS_MAX; the mat-vec kernel on CPU drivers), mat_vec (the mat-vec kernel's column groups
# up to 8 columns, then the mat-mat kernels), mat_cols (the mat-cols kernel on every device).
BATCH_KERNELS = ("auto", "mat_vec", "mat_cols", "mat_mat")
# Which kernel products past the mat-vec column groups (prefill) take (kernels/matmul.py
# `mat_mat_path`): auto (cooperative matrices where offered, else 8-bit integer dot products where
# the device accelerates them, else the tiled kernel; CPU drivers: the mat-vec groups), or one of
# the mat-mat kernels on every device that has it (tests, `vkllm bench`).
PREFILL_KERNELS = ("auto", "tiled", "mmq", "coopmat")
# Which kernel one-column products (decode) of quantized weights take (kernels/matmul.py
# `decode_x8`): auto (over 8-bit activations on GPUs with integer dot products, else f32), mat_vec
# (f32 activations, with norms folded in), x8 (8-bit activations on every device that has them).
DECODE_KERNELS = ("auto", "mat_vec", "x8")


def _default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vkllm"


@dataclass(frozen=True)
class Settings:
    device: str | None = None          # index or name substring of the Vulkan device to use
    validation: bool = False           # enable VK_LAYER_KHRONOS_validation
    cache_dir: Path = field(default_factory=_default_cache)   # compiled SPIR-V and the like
    models_dir: Path = Path("models")
    tune: bool | None = None           # time mat-vec shapes per device at load; None: on GPUs, not CPU drivers
    max_sequences: int = 16            # sequences one Engine's Batch decodes together (capped by the memory plan)
    kv_type: str = "f16"               # KV cache values: f16, or q8_0 (8-bit, half the memory)
    batch_kernel: str = "auto"         # products of 2.. columns: one of BATCH_KERNELS
    prefill_kernel: str = "auto"       # products past the mat-vec groups: one of PREFILL_KERNELS
    decode_kernel: str = "auto"        # one-column products of quantized weights: one of DECODE_KERNELS
    # Devices (index or name substring each) whose contexts a model's layers are split across,
    # in order; one may repeat (two contexts on one device). None: the one of `device`.
    devices: tuple[str, ...] | None = None
    split: tuple[float, ...] | None = None   # shares of the layers per device; None: by free memory
    # share of each device's memory the device may have in use once the models are loaded (vLLM's
    # --gpu-memory-utilization): below 1 it leaves room for a desktop or a game on the same GPU
    gpu_memory_utilization: float = 1.0

    def __post_init__(self):
        if self.split is not None and len(self.split) != len(self.devices or (self.device,)):
            raise VkllmError(f"a split of {len(self.split)} shares needs as many devices, not "
                             f"{len(self.devices or (self.device,))}")

    @classmethod
    def from_env(cls, env=None) -> "Settings":
        env = os.environ if env is None else env
        return cls(
            device=env.get("VKLLM_DEVICE") or None,
            validation=env.get("VKLLM_VALIDATION", "0") not in ("", "0", "false", "no"),
            cache_dir=Path(env["VKLLM_CACHE_DIR"]) if env.get("VKLLM_CACHE_DIR") else _default_cache(),
            models_dir=Path(env.get("VKLLM_MODELS_DIR", "models")),
            tune=_tune(env.get("VKLLM_TUNE", "auto")),
            max_sequences=_positive("VKLLM_MAX_SEQUENCES", env.get("VKLLM_MAX_SEQUENCES", "16")),
            kv_type=_kv_type(env.get("VKLLM_KV_TYPE", "f16")),
            batch_kernel=_choice("VKLLM_BATCH_KERNEL", env.get("VKLLM_BATCH_KERNEL", ""), BATCH_KERNELS, "auto"),
            prefill_kernel=_choice("VKLLM_PREFILL_KERNEL", env.get("VKLLM_PREFILL_KERNEL", ""), PREFILL_KERNELS,
                                   "auto"),
            decode_kernel=_choice("VKLLM_DECODE_KERNEL", env.get("VKLLM_DECODE_KERNEL", ""), DECODE_KERNELS, "auto"),
            devices=devices_list(env.get("VKLLM_DEVICES", "")),
            split=split_shares(env.get("VKLLM_SPLIT", "")),
            gpu_memory_utilization=memory_utilization("VKLLM_GPU_MEMORY_UTILIZATION",
                                                      env.get("VKLLM_GPU_MEMORY_UTILIZATION", "1")),
        )


def placed(settings: Settings, devices: str | None, split: str | None, utilization: str | None) -> Settings:
    """The settings with a command's --devices, --split and --gpu-memory-utilization (as typed;
    None: the environment's)."""
    devices = settings.devices if devices is None else devices_list(devices)
    return replace(settings, devices=devices, split=settings.split if split is None else split_shares(split),
                   gpu_memory_utilization=settings.gpu_memory_utilization if utilization is None
                   else memory_utilization("--gpu-memory-utilization", utilization))


def memory_utilization(name: str, value: str) -> float:
    """A share of device memory: a number above 0, at most 1."""
    try:
        share = float(value)
    except ValueError:
        share = 0.0
    if not 0 < share <= 1:
        raise VkllmError(f"{name} must be a share of the device's memory above 0 and at most 1, not {value!r}")
    return share


def _tune(value: str) -> bool | None:
    try:
        return _TUNE[value.strip().lower()]
    except KeyError:
        raise VkllmError(f"VKLLM_TUNE must be 0, 1 or auto, not {value!r}") from None


def _positive(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise VkllmError(f"{name} must be a positive integer, not {value!r}")
    return number


def _kv_type(value: str) -> str:
    kv_type = value.strip().lower()
    if kv_type not in KV_TYPES:
        raise VkllmError(f"VKLLM_KV_TYPE must be one of {', '.join(KV_TYPES)}, not {value!r}")
    return kv_type


def _choice(name: str, value: str, choices: tuple[str, ...], default: str) -> str:
    """One of `choices` (`default` when empty)."""
    choice = value.strip().lower() or default
    if choice not in choices:
        raise VkllmError(f"{name} must be one of {', '.join(choices)}, not {value!r}")
    return choice


def devices_list(value: str) -> tuple[str, ...] | None:
    """'0,1' -> ('0', '1'); '' -> None (one device)."""
    devices = tuple(d.strip() for d in value.split(",")) if value.strip() else None
    if devices is not None and not all(devices):
        raise VkllmError(f"devices are a comma-separated list of indices or names, not {value!r}")
    return devices


def split_shares(value: str) -> tuple[float, ...] | None:
    """'40,60' -> (40.0, 60.0), each device's share of the layers; '' -> None (by free memory)."""
    if not value.strip():
        return None
    try:
        shares = tuple(float(v) for v in value.split(","))
    except ValueError:
        shares = ()
    if not shares or any(not share >= 0 for share in shares) or not sum(shares) > 0:
        raise VkllmError(f"a split is comma-separated non-negative shares of the layers (40,60), not {value!r}")
    return shares
