"""The `vkllm` command. Each concern registers its own subcommands; imports stay lazy so that
`vkllm --help` needs neither Vulkan nor Flask."""
import argparse
import importlib
import logging
import sys

from vkllm.errors import VkllmError

# module path -> that module's `register(subparsers)` adds its subcommands.
COMMAND_MODULES = (
    "worker.tools.devices",
    "worker.tools.models",
    "worker.tools.generate",
    "worker.tools.bench",
    "worker.tools.tune",
    "worker.service.cli",
    "appliance.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vkllm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def configure_logging():
    """Informational lines (a first load on a device timing its kernels' shapes, which can take
    minutes) on stderr, where the commands' own output on stdout stays clean; `vkllm worker` puts
    its timestamped format in place of this one. The gguf package's INFO lines as it writes a
    file (byte order, file sizes) are not ours; its warnings still show."""
    logging.basicConfig(level=logging.INFO, format="vkllm: %(message)s", stream=sys.stderr)
    logging.getLogger("gguf").setLevel(logging.WARNING)


def main(argv=None) -> int:
    configure_logging()
    try:
        args = build_parser().parse_args(argv)
        return args.func(args) or 0
    except VkllmError as e:
        print(f"vkllm: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.filename is None:   # not about a path the user named: a fault worth its traceback
            raise
        print(f"vkllm: error: {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
