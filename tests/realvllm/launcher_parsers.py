"""Run by the real vLLM's interpreter (tests/realvllm/test_launcher_flags.py): builds vLLM's
own server parsers (``make_arg_parser`` as ``-m vllm.entrypoints.openai.api_server`` builds it,
and the ``vllm serve`` subcommand's) and torch's ``torchrun`` parser, and prints as JSON what
the test compares with outrig's table: every option's strings, destination and arity, and
each command line of stdin's list parsed by the real parser. Starts no server.

stdin: ``{"vllm": [argv...], "torchrun": [argv...]}``; a vLLM argv starting with ``serve``
goes to the CLI's parser, any other to the API server's.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import vllm.platforms

# A machine without GPUs has no device type, and building the parser fails ("Failed to infer
# device type"); the parser only needs a name (tests/contract/test_real_parsers.py).
if not vllm.platforms.current_platform.device_type:
    vllm.platforms.current_platform.device_type = "cuda"

from torch.distributed.run import get_args_parser
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

SIZES = ("tensor_parallel_size", "pipeline_parallel_size", "prefill_context_parallel_size",
         "data_parallel_size", "nnodes", "node_rank", "data_parallel_size_local",
         "data_parallel_rank", "data_parallel_start_rank", "data_parallel_address", "headless")


def options(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    return [{"strings": list(a.option_strings), "dest": a.dest, "nargs": a.nargs}
            for a in parser._actions if a.option_strings]


def main() -> None:
    cases = json.load(sys.stdin)
    api = make_arg_parser(FlexibleArgumentParser())
    cli = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = cli.add_subparsers(required=False, dest="subparser")
    ServeSubcommand().subparser_init(subparsers)
    torchrun = get_args_parser()
    parsed: list[dict[str, Any]] = []
    for argv in cases["vllm"]:
        args = (cli if argv[:1] == ["serve"] else api).parse_args(argv)
        parsed.append({k: getattr(args, k) for k in SIZES})
    ran: list[dict[str, Any]] = []
    for argv in cases["torchrun"]:
        args = torchrun.parse_args(argv)
        ran.append({"nproc_per_node": args.nproc_per_node, "nnodes": args.nnodes})
    plain = cli.parse_args(["serve", "M"])
    print(json.dumps({"vllm_options": options(api), "torchrun_options": options(torchrun),
                      "vllm": parsed, "torchrun": ran,
                      "vllm_defaults": {k: getattr(plain, k) for k in SIZES}}, default=str))


if __name__ == "__main__":
    main()
