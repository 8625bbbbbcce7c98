"""``mascot serve``: the policies over HTTP, OpenAI-compatible: the local engine or vLLM."""

from __future__ import annotations

import argparse
import ipaddress
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from mascot.cli.options import UsageError, err, out, positive

if TYPE_CHECKING:  # imported where used: `mascot --help` loads no LangChain
    from mascot.policies.serving import ServedPolicies

def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``serve`` to the command line."""
    serve = commands.add_parser("serve", help="serve a policy file's base model and adapters, OpenAI-compatible")
    serve.add_argument("--policies", required=True, metavar="FILE", help="policy file whose local roles to serve")
    serve.add_argument("--engine", choices=("local", "vllm"), default="local",
                       help="local: in-process transformers; vllm: the vLLM server of .venv-vllm "
                            "(scripts/install --vllm), on a CPU or a GPU")
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=positive, default=8000, help="port to listen on")
    serve.add_argument("--api-key-env", metavar="NAME",
                       help="environment variable with the API key every request must send")
    serve.add_argument("--allow-runtime-lora", action="store_true",
                       help="enable /v1/load_lora_adapter and /v1/unload_lora_adapter (for --reload)")
    serve.add_argument("--adapters-dir", metavar="DIR",
                       help="the only folder runtime-loaded adapters may come from (default: the policy file's)")
    serve.add_argument("--served-model-name", metavar="NAME", help="the base model's name in requests")
    serve.add_argument("--max-tokens-cap", type=positive, default=1024, metavar="N",
                       help="largest max_tokens a request gets (local engine; default 1024)")
    serve.add_argument("--client-policies", metavar="FILE",
                       help="write a policy file that points every served role at this server")
    serve.add_argument("--vllm-args", default="", metavar="'ARGS'",
                       help="vllm: more server arguments, e.g. '--tensor-parallel-size 2' or "
                            "'--data-parallel-size 4'")
    serve.add_argument("--dry-run", action="store_true", help="vllm: print the engine's command and exit")
    serve.add_argument("--reload", action="store_true",
                       help="load the policy file's adapters into the server running at --url, and exit")
    serve.add_argument("--url", metavar="URL", help="with --reload: the running server's .../v1 URL")
    serve.set_defaults(run=_serve)


def _serve(args: argparse.Namespace) -> int:
    from mascot.policies.serving import ServedPolicies, reload_adapters

    served = ServedPolicies.from_file(args.policies)
    api_key = _api_key(args.api_key_env)
    if args.reload:
        if not args.url:
            raise UsageError("--reload needs --url (the running server, e.g. http://127.0.0.1:8000/v1)")
        names = reload_adapters(args.url, served, api_key=api_key)
        _write_client_policies(args, served, args.url, base_name=_served_name(args, served))
        out.print(f"serve: reloaded {', '.join(names) or 'no adapters'} into {args.url}", markup=False)
        return 0
    url = f"http://{args.host}:{args.port}/v1"
    if not api_key and not _loopback(args.host):
        err.print(f"warning: serving on {args.host} without an API key (--api-key-env)", markup=False)
    if args.engine == "vllm":
        return _vllm(args, served, url)
    if args.dry_run or args.vllm_args:
        raise UsageError("--dry-run and --vllm-args are for --engine vllm")
    import uvicorn

    from mascot.policies.local import LocalBackend
    from mascot.policies.local.server import ServerLimits, create_app

    backend = LocalBackend.load(served.base, adapters={a.name: a.path for a in served.adapters.values()},
                                adapter_versions={a.name: a.version for a in served.adapters.values()})
    adapters_dir = Path(args.adapters_dir or Path(args.policies).parent)
    if not adapters_dir.is_dir():
        raise UsageError(f"--adapters-dir: no such folder {adapters_dir}")
    app = create_app(backend, served_name=_served_name(args, served), api_key=api_key,
                     adapters_dir=adapters_dir, allow_runtime_lora=args.allow_runtime_lora,
                     limits=ServerLimits(max_tokens=args.max_tokens_cap))
    _write_client_policies(args, served, url, base_name=_served_name(args, served))
    out.print(f"serve: {served.base} + {', '.join(served.adapters) or 'no adapters'} at {url}", markup=False)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _vllm(args: argparse.Namespace, served: ServedPolicies, url: str) -> int:
    from mascot.policies.vllm import VllmServer, vllm_python

    server = VllmServer(served, host=args.host, port=args.port, served_name=_served_name(args, served),
                        api_key=_api_key(args.api_key_env), allow_runtime_lora=args.allow_runtime_lora,
                        extra=shlex.split(args.vllm_args), echo=True)
    if args.dry_run:
        argv, env = server.command(python=vllm_python() or "python")
        if args.api_key_env:
            env["VLLM_API_KEY"] = f"${args.api_key_env}"
        out.print(" ".join([*(f"{k}={v}" for k, v in env.items()), shlex.join(argv)]), markup=False)
        return 0
    server.command()  # vLLM installed, adapters readable: before anything is written or started
    _write_client_policies(args, served, url, base_name=server.served_name)
    err.print(f"starting vLLM for {served.base} + {', '.join(served.adapters) or 'no adapters'}", markup=False)
    try:
        server.start()
        out.print(f"serve: vLLM ready at {url} in {server.started_in:.0f} s (log: {server.log})", markup=False)
        assert server.process is not None
        code = server.process.wait()
        if code:
            err.print(f"mascot: error: vLLM exited with code {code}: {server.cause()} (log: {server.log})",
                      markup=False)
            return 1
        return 0
    except KeyboardInterrupt:
        err.print("serve: stopping vLLM", markup=False)
        return 130
    finally:
        server.stop()


def _served_name(args: argparse.Namespace, served: ServedPolicies) -> str:
    """The base model's name in requests: ``--served-model-name``, else a local model
    folder's name (its absolute path stays private), else the Hub id as given."""
    if args.served_model_name:
        return args.served_model_name
    return Path(served.base).name if Path(served.base).expanduser().is_dir() else served.base


def _api_key(name: str | None) -> str | None:
    if name is None:
        return None
    value = os.environ.get(name)
    if not value:
        raise UsageError(f"--api-key-env: the variable {name} is not set")
    return value


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _write_client_policies(args: argparse.Namespace, served: ServedPolicies, url: str, *,
                           base_name: str | None = None) -> None:
    if not args.client_policies:
        return
    from mascot.policies.serving import client_policies

    data = client_policies(served, url, api_key_env=args.api_key_env)
    if base_name:
        for entry in data["roles"].values():
            if entry["model"] == served.base:
                entry["model"] = base_name
    path = Path(args.client_policies)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    err.print(f"client policy file: {path}", markup=False)
