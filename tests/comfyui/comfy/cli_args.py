"""ComfyUI's command-line flags: the subset the memory manager reads.

As upstream, the module parses at import time: the real `sys.argv` when
`comfy.options.enable_args_parsing()` ran first, otherwise no arguments at
all (every flag at its default).  Unknown flags are an error, as upstream.
"""

import argparse
import enum

import comfy.options


class PerformanceFeature(enum.Enum):
    Fp16Accumulation = "fp16_accumulation"
    Fp8MatrixMultiplication = "fp8_matrix_mult"
    CublasOps = "cublas_ops"
    AutoTune = "autotune"


parser = argparse.ArgumentParser()

# Server flags: main.py serves on --listen/--port and takes the folders
# from the directory flags; the device flags are parsed, not acted on.
parser.add_argument("--listen", type=str, default="127.0.0.1", metavar="IP", nargs="?", const="0.0.0.0,::")
parser.add_argument("--port", type=int, default=8188)
parser.add_argument("--base-directory", type=str, default=None)
parser.add_argument("--output-directory", type=str, default=None)
parser.add_argument("--input-directory", type=str, default=None)
parser.add_argument("--temp-directory", type=str, default=None)
parser.add_argument("--cuda-device", type=str, default=None, metavar="DEVICE_ID")
parser.add_argument("--default-device", type=int, default=None, metavar="DEFAULT_DEVICE_ID")
parser.add_argument("--directml", type=int, nargs="?", metavar="DIRECTML_DEVICE", const=-1)
parser.add_argument("--deterministic", action="store_true")
parser.add_argument("--force-fp32", action="store_true")
parser.add_argument("--force-fp16", action="store_true")
parser.add_argument("--fp16-unet", action="store_true")
parser.add_argument("--cpu-vae", action="store_true")
parser.add_argument("--disable-xformers", action="store_true")
parser.add_argument("--verbose", nargs="*", default=[], metavar="LEVEL")
parser.add_argument("--log-stdout", action="store_true")
parser.add_argument("--disable-all-custom-nodes", action="store_true")
parser.add_argument("--whitelist-custom-nodes", type=str, nargs="+", default=[])
parser.add_argument("--dont-print-server", action="store_true")
parser.add_argument("--quick-test-for-ci", action="store_true")

# How much of the card to use: mutually exclusive, as upstream.
vram_group = parser.add_mutually_exclusive_group()
vram_group.add_argument("--gpu-only", action="store_true")
vram_group.add_argument("--highvram", action="store_true")
vram_group.add_argument("--normalvram", action="store_true")
vram_group.add_argument("--lowvram", action="store_true")
vram_group.add_argument("--novram", action="store_true")
vram_group.add_argument("--cpu", action="store_true")

parser.add_argument("--reserve-vram", type=float, default=None,
                    help="GB of VRAM kept back for other software (overrides the default reserve).")
parser.add_argument("--disable-smart-memory", action="store_true")
parser.add_argument("--disable-pinned-memory", action="store_true")
parser.add_argument("--async-offload", nargs="?", const=2, type=int, default=None, metavar="NUM_STREAMS")
parser.add_argument("--disable-async-offload", action="store_true")
parser.add_argument("--disable-dynamic-vram", action="store_true")
parser.add_argument("--enable-dynamic-vram", action="store_true")
parser.add_argument("--fast-disk", action="store_true")
parser.add_argument("--fast", nargs="*", type=PerformanceFeature)

cache_group = parser.add_mutually_exclusive_group()
cache_group.add_argument("--cache-ram", nargs="*", type=float, default=[], metavar="GB")
cache_group.add_argument("--cache-classic", action="store_true")
cache_group.add_argument("--cache-lru", type=int, default=0)
cache_group.add_argument("--cache-none", action="store_true")
cache_group.add_argument("--high-ram", action="store_true")

args = parser.parse_args() if comfy.options.args_parsing else parser.parse_args([])

if args.high_ram:
    args.cache_classic = True
if args.force_fp16:
    args.fp16_unet = True
if args.fast is None:
    args.fast = set()
elif args.fast == []:
    args.fast = set(PerformanceFeature)
else:
    args.fast = set(args.fast)


def enables_dynamic_vram():
    """Whether the paged loader would be on (this stand-in never has one)."""
    if args.enable_dynamic_vram:
        return True
    return not (args.disable_dynamic_vram or args.highvram or args.gpu_only
                or args.novram or args.cpu)
