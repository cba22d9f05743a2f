"""The ``lookahead-reasoning`` command: argument parsing only; the work is done by library functions."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import get_args

from .benchmarking.bench import register as register_bench
from .core.request import add_request_flags, request_values
from .core.steps import ReasoningParser
from .evaluation.eval_cli import EVAL_SKIP, add_eval_arguments, cmd_eval
from .production.engine_build import register as register_build

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Flags that are not request fields (those are named by lookahead_reasoning.core.request), for one-line errors.
_OTHER_FLAGS = {"profile": "--profile", "config": "--config", "dataset": "--dataset", "modes": "--modes",
                "http_port": "--http-port", "grpc_port": "--grpc-port", "metrics_port": "--metrics-port"}


def format_error(exc: Exception) -> str:
    """One line naming the offending argument by its flag (request fields through
    :func:`lookahead_reasoning.core.request.front_error`)."""
    from .core.request import front_error

    line = front_error(exc, "cli")
    head, sep, rest = line.partition(":")
    return f"{_OTHER_FLAGS[head]}:{rest}" if sep and head in _OTHER_FLAGS else line


def _profile_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default=None, help="built-in profile (default: demo)")
    p.add_argument("--config", default=None, help="profile YAML file (overrides --profile)")


def cmd_generate(args) -> int:
    from .core.calibration import calibrate_reasoner
    from .core.request import parse_request
    from .profiles import build_reasoner_for, close_reasoner, load_profile

    profile = load_profile(args.profile, args.config)
    req, opts = parse_request(request_values(args), profile.options)
    messages = req.chat()
    args.prompt = req.prompt
    reasoner = build_reasoner_for(profile, opts, [opts.mode])
    try:
        if opts.speculative and args.json:
            reasoner.cost_model = calibrate_reasoner(reasoner, args.prompt, messages,
                                                     ns=tuple(range(2, opts.gamma + 2)))
        if args.json:
            res = reasoner.run(args.prompt, messages, opts, checked=True)  # parse_request checked the input
        else:
            res = _stream_to_stdout(reasoner, args.prompt, messages, opts, req.trimmer(opts))
    finally:
        close_reasoner(reasoner)
    m = res.metrics
    if args.json:
        metrics = m.to_dict()
        metrics["finish_reason"] = res.finish_reason
        if reasoner.cost_model is not None:
            metrics["cost_model"] = reasoner.cost_model.to_dict()
        from .core.steps import split_reasoning

        text = req.trimmer(opts).apply(res.text, res.finish_reason == "stop")  # the stop string left out
        reasoning, content = split_reasoning(text, reasoner.reasoning_parser)
        print(json.dumps({"text": text, "reasoning_content": reasoning, "content": content, "mode": res.mode,
                          "metrics": metrics}))
    else:
        acc = "n/a" if m.acceptance_rate is None else f"{m.acceptance_rate:.2f}"
        print(flush=True)  # the answer's line ends on stdout
        print(f"[{res.mode}] {m.generated_tokens} tokens in {m.seconds:.2f} s ({m.tokens_per_s:.1f} tok/s), "
              f"{m.cycles} cycles, step acceptance {acc}, finish={res.finish_reason}", file=sys.stderr)
    return 0


def _stream_to_stdout(reasoner, prompt, messages, opts, trim):
    import asyncio

    from .core.lookahead import LRResult

    async def go():
        result = None
        async for ev in reasoner.stream(prompt, messages, opts, checked=True):
            if isinstance(ev, LRResult):
                result = ev
                sys.stdout.write(trim.apply("", ev.finish_reason == "stop"))
            else:
                sys.stdout.write(trim.feed(ev.text))
            sys.stdout.flush()
        return result

    return asyncio.run(go())


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse names the option in its error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def cmd_serve(args) -> int:
    from .serving.server import ServerConfig, TritonServer, check_ports_free, prepare_repository, serve_forever

    # before anything is written: a busy port ends here, naming its option
    check_ports_free(args.host, {"--http-port": args.http_port, "--grpc-port": args.grpc_port,
                                 "--metrics-port": args.metrics_port, "--openai-port": args.openai_port})
    limits = {"max_tokens_limit": str(args.max_tokens_limit), "max_prompt_bytes": str(args.max_prompt_bytes),
              "max_concurrency": str(args.max_concurrency), "bls_threads": str(args.bls_threads),
              "call_timeout_s": str(args.call_timeout_s or 0),
              "judge_timeout_s": str(args.judge_timeout_s or 0), "draft_timeout_s": str(args.draft_timeout_s or 0),
              "target_timeout_s": str(args.target_timeout_s or 0)}
    import shutil

    from .serving.server import remove_stale_repositories

    remove_stale_repositories()  # of a serve killed before it could clean up
    repo = prepare_repository(args.profile, args.config, args.model_repository, limits,
                              reasoning_parser=args.reasoning_parser)
    config = ServerConfig(repo, args.host, args.http_port, args.grpc_port, args.metrics_port,
                          model_control_mode=args.model_control_mode, guard_role_models=not args.open_role_models,
                          log_level=args.log_level)
    print(f"model repository: {repo}", flush=True)
    try:
        return serve_forever(TritonServer(config, log_path=args.log_file, log_to_stderr=True),
                             openai_port=args.openai_port)
    finally:
        if not args.model_repository:  # the temporary repository goes with the server
            shutil.rmtree(repo, ignore_errors=True)


def cmd_client(args) -> int:
    import asyncio

    from .core.request import BY_NAME
    from .serving.client import TritonLRClient

    values = request_values(args, skip=("prompt",))
    params = {BY_NAME[k].triton: v for k, v in values.items()}  # the server validates, naming Triton inputs
    client = TritonLRClient(args.url, args.protocol)

    async def go():
        if args.stream:
            text, metrics = "", {}
            async for c in client.stream(args.prompt, **params):
                if c.metrics is not None:
                    metrics = c.metrics
                if not args.json:  # the final chunk may hold text the server held back at a possible stop
                    sys.stdout.write(c.text)
                    sys.stdout.flush()
                text += c.text
            return text, metrics
        ans = await client.generate(args.prompt, **params)
        if not args.json:
            sys.stdout.write(ans.text)
        return ans.text, ans.metrics

    from .core.request import translate
    from .serving.client import ServerError, transport_error

    try:
        text, metrics = asyncio.run(go())
    except (ValueError, ServerError) as exc:
        raise ValueError(translate(str(exc).splitlines()[0], "triton", "cli")) from None
    except Exception as exc:  # noqa: BLE001 - transport errors: one line naming the URL, non-zero exit
        raise ValueError(transport_error(exc, args.url)) from None
    if args.json:
        print(json.dumps({"text": text, "mode": metrics.get("mode"), "metrics": metrics}))
    else:
        acc = metrics.get("acceptance_rate")
        print(flush=True)  # the answer's line ends on stdout
        print(f"[{metrics.get('mode')}] {metrics.get('generated_tokens')} tokens in {metrics.get('seconds', 0):.2f} s, "
              f"acceptance {'n/a' if acc is None else f'{acc:.2f}'}", file=sys.stderr)
    return 0


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default where it has one of its own. Unset flags (default None: the request's fields take
    the profile's values) and required ones show none, and a help text that names its default is left as is."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.required or action.default is None or action.default is False \
                or action.default == argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``PROG: error: argument --x: ...``), exit status 2, and every flag's default
    in ``--help``."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def _register_serve(sub) -> None:
    """The ``serve`` subcommand: Triton's ports, the OpenAI front, request limits, role-call timeouts, logging."""
    s = sub.add_parser("serve", help="start Triton Inference Server with the profile's models")
    s.add_argument("--profile", default=None, help="built-in profile (default: demo)")
    s.add_argument("--config", default=None, help="profile YAML file")
    s.add_argument("--model-repository", default=None, help="render the repository here (default: a temp dir)")
    s.add_argument("--host", default="127.0.0.1", help="bind address of every port (default loopback)")
    s.add_argument("--http-port", type=int, default=8000, help="Triton HTTP/REST port (KServe v2, generate)")
    s.add_argument("--grpc-port", type=int, default=8001, help="Triton gRPC port (streaming)")
    s.add_argument("--metrics-port", type=int, default=8002, help="Prometheus metrics port")
    s.add_argument("--openai-port", type=int, default=None, help="also serve the OpenAI-compatible front here")
    s.add_argument("--model-control-mode", choices=("none", "explicit"), default="explicit",
                   help="Triton's model control mode: explicit loads every model at start, lets the API load and "
                        "unload them, and lets serve reload a model whose process died; none: neither")
    s.add_argument("--reasoning-parser", choices=get_args(ReasoningParser), default=None,
                   help="split <think> traces from answers on the OpenAI front, as vLLM's --reasoning-parser "
                        "(default: the profile's)")
    s.add_argument("--max-tokens-limit", type=_positive_int, default=4096, help="largest max_tokens a request may ask")
    s.add_argument("--max-prompt-bytes", type=_positive_int, default=65536, help="largest prompt in UTF-8 bytes")
    s.add_argument("--max-concurrency", type=_positive_int, default=256, help="requests in flight before refusing")
    s.add_argument("--bls-threads", type=_positive_int, default=64,
                   help="worker threads for the orchestrator's BLS calls (role-model calls in flight at once)")
    s.add_argument("--call-timeout-s", type=float, default=None,
                   help="timeout of each call to a role model, s (unset: none)")
    s.add_argument("--judge-timeout-s", type=float, default=None,
                   help="per judge call, s; slower = drafts rejected (unset: none)")
    s.add_argument("--draft-timeout-s", type=float, default=None,
                   help="per draft call, s; slower = target-only (unset: none)")
    s.add_argument("--target-timeout-s", type=float, default=None,
                   help="per target call, s; slower = error (unset: none)")
    s.add_argument("--log-file", default=None,
                   help="append Triton's log (with one access-log line per request) here instead of stderr")
    s.add_argument("--log-level", choices=("error", "warning", "info", "verbose"), default="info",
                   help="Triton's log level; info includes the access log")
    s.add_argument("--open-role-models", action="store_true",
                   help="let clients call the draft, target and judge models directly (by default they answer only "
                        "the lookahead_reasoning model's internal calls, which carry a per-server secret)")
    s.set_defaults(func=cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("lookahead-reasoning")
    except PackageNotFoundError:  # a checkout that was not installed
        ver = "unknown (not installed)"
    parser = _Parser(prog="lookahead-reasoning", description=(
        "Lookahead Reasoning: a small draft model proposes whole reasoning steps, the target verifies several in "
        "one batched call and a judge keeps those that mean the same; token-level speculative decoding runs "
        "inside every step. Commands: generate (one prompt in-process), eval (accuracy and speed per mode), "
        "serve (Triton), client, bench (latency under load), build (TensorRT-LLM engines)."))
    parser.add_argument("--version", action="version", version=f"%(prog)s {ver}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="answer one prompt in-process")
    _profile_flags(g)
    add_request_flags(g)
    g.add_argument("--json", action="store_true",
                   help="print one JSON object: text, reasoning_content and content (split by the profile's "
                        "reasoning_parser), mode, metrics")
    g.set_defaults(func=cmd_generate)

    e = sub.add_parser("eval", help="accuracy and speed per mode on datasets")
    e.add_argument("--limit", type=int, default=None, help="items per dataset (default: all)")
    e.add_argument("--modes", default="ar,sd,lr,lr+sd", help="comma-separated modes, run on the same items")
    e.add_argument("--out", default=None, help="write the JSON report here")
    e.add_argument("--keep-outputs", action="store_true", help="include every answer in the report")
    _profile_flags(e)
    add_request_flags(e, skip=EVAL_SKIP)
    add_eval_arguments(e)
    e.set_defaults(func=cmd_eval)
    register_bench(sub)
    register_build(sub)

    _register_serve(sub)

    c = sub.add_parser("client", help="send one prompt to a running server")
    c.add_argument("--url", default="127.0.0.1:8001", help="HOST:PORT (gRPC port, or HTTP port with --protocol http)")
    c.add_argument("--protocol", choices=("grpc", "http"), default="grpc", help="protocol of --url")
    c.add_argument("--prompt", required=True, help="the prompt (sent as one user message where the model chats)")
    c.add_argument("--stream", action="store_true", help="print steps as they arrive")
    c.add_argument("--json", action="store_true", help="print one JSON object: text, mode, metrics")
    add_request_flags(c, skip=("prompt", "messages"))
    c.set_defaults(func=cmd_client)
    return parser


def main(argv: list[str] | None = None) -> int:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"lookahead-reasoning {args.command}: error: {format_error(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
