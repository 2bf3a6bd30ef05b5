"""`vkllm devices` and `vkllm shaders build`."""
from pathlib import Path

from worker.engine.config import Settings


def register(sub):
    devices = sub.add_parser("devices", help="list Vulkan devices and the one vkllm would use")
    devices.set_defaults(func=_devices)
    shaders = sub.add_parser("shaders", help="shader cache").add_subparsers(dest="shaders_command", required=True)
    build = shaders.add_parser("build", help="compile every shader variant into the cache")
    build.set_defaults(func=_build)


def _devices(args):
    from worker.engine.vk import device as vkdevice
    settings = Settings.from_env()
    instance = vkdevice.create_instance(validation=False)
    candidates = vkdevice.list_devices(instance)
    chosen, _ = vkdevice.choose_device(candidates, settings.device)
    for info, _ in candidates:
        print(("* " if info is chosen else "  ") + info.describe())


def _build(args):
    from worker.engine.shaderbuild import build_all
    settings = Settings.from_env()
    paths = build_all(Path(settings.cache_dir))
    print(f"{len(paths)} shader variants in {settings.cache_dir / 'spirv'}")
