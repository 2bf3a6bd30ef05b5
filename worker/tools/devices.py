"""`vkllm devices` and `vkllm shaders build`; the --devices/--split arguments of the commands that load models."""
from pathlib import Path

from worker.engine.config import Settings, placed


def register(sub):
    devices = sub.add_parser("devices", help="list Vulkan devices and the ones vkllm would use")
    devices.set_defaults(func=_devices)
    shaders = sub.add_parser("shaders", help="shader cache").add_subparsers(dest="shaders_command", required=True)
    build = shaders.add_parser("build", help="compile every shader variant into the cache")
    build.set_defaults(func=_build)


def add_device_arguments(p):
    """--devices, --split and --gpu-memory-utilization, for the commands that load models
    (`worker`, `generate`, `bench`, `models inspect`); read with `settings(args)`."""
    p.add_argument("--devices", default=None, metavar="I,J,...",
                   help="split the layers across these Vulkan devices (indices or names, in order; one may "
                        "repeat for several contexts on it; default: VKLLM_DEVICES, else one device)")
    p.add_argument("--split", default=None, metavar="A,B,...",
                   help="each device's share of the layers (default: VKLLM_SPLIT, else by free memory)")
    p.add_argument("--gpu-memory-utilization", default=None, metavar="SHARE",
                   help="share of each device's memory (0 to 1) that may be in use once the models are "
                        "loaded, the KV cache included (default: VKLLM_GPU_MEMORY_UTILIZATION, else 1)")


def settings(args) -> Settings:
    """The environment's settings with the command's --devices, --split and --gpu-memory-utilization."""
    return placed(Settings.from_env(), args.devices, args.split, args.gpu_memory_utilization)


def _devices(args):
    from worker.engine.vk import device as vkdevice
    settings = Settings.from_env()
    instance = vkdevice.create_instance(validation=False)
    candidates = vkdevice.list_devices(instance)
    chosen = {vkdevice.choose_device(candidates, wanted)[0].index
              for wanted in settings.devices or (settings.device,)}
    for info, _ in candidates:
        print(("* " if info.index in chosen else "  ") + info.describe())


def _build(args):
    from worker.engine.shaderbuild import build_all
    settings = Settings.from_env()
    paths = build_all(Path(settings.cache_dir))
    print(f"{len(paths)} shader variants in {settings.cache_dir / 'spirv'}")
