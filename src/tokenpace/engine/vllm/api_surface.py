"""The parts of vLLM's source the scheduler plugin relies on, and a check of a vLLM source
tree against them that reads the source (``ast``) without importing it.

``scheduler.TokenpaceScheduler`` subclasses vLLM's V1 ``Scheduler`` and touches private
members (its waiting queues, preemption hook, KV block pool). A release that renames or
reshapes one of them breaks the plugin. ``check_source`` compares a vLLM source tree (an
installed package or an unpacked wheel of a release that cannot run here, e.g. a CUDA-only
one) with ``USED_MEMBERS`` and lists every mismatch; the tests run it for every series in
``version.SUPPORTED_SERIES``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

_SCHED = "vllm/v1/core/sched/scheduler.py"
_ASYNC = "vllm/v1/core/sched/async_scheduler.py"
_QUEUE = "vllm/v1/core/sched/request_queue.py"
_OUTPUT = "vllm/v1/core/sched/output.py"
_REQUEST = "vllm/v1/request.py"


@dataclass(frozen=True, slots=True)
class UsedMember:
    """A member ``name`` of class ``owner`` in vLLM's file ``path`` (relative to the folder
    holding the ``vllm`` package). ``params`` is None for an attribute (set on ``self``,
    a class-level field or enum member, or a property); for a method, the leading
    parameters (after ``self``) the plugin passes or overrides, by name and in order; any
    further parameter must have a default unless ``forwards_rest`` (the plugin's override
    takes ``*args, **kwargs`` and hands them on)."""

    path: str
    owner: str
    name: str
    params: tuple[str, ...] | None = None
    forwards_rest: bool = False


def _attrs(path: str, owner: str, names: str) -> tuple[UsedMember, ...]:
    """Attributes of ``owner``, ``names`` separated by spaces."""
    return tuple(UsedMember(path, owner, name) for name in names.split())


_SCHEDULER_ATTRS = (
    "requests waiting running kv_holding_waiting kv_cache_manager scheduler_config "
    "block_size max_model_len max_num_scheduled_tokens max_num_running_reqs"
)
_REQUEST_ATTRS = (
    "request_id num_prompt_tokens max_tokens num_computed_tokens output_token_ids status "
    "num_tokens_with_spec num_output_placeholders"
)
_STATUSES = "RUNNING FINISHED_STOPPED FINISHED_LENGTH_CAPPED FINISHED_IGNORED"

USED_MEMBERS: tuple[UsedMember, ...] = (
    # Scheduler methods the plugin overrides or calls, and the state it reads or swaps.
    UsedMember(_SCHED, "Scheduler", "__init__", (), forwards_rest=True),
    UsedMember(_SCHED, "Scheduler", "add_request", ("request",)),
    UsedMember(_SCHED, "Scheduler", "get_request_counts", ()),
    UsedMember(_SCHED, "Scheduler", "schedule", (), forwards_rest=True),
    UsedMember(
        _SCHED, "Scheduler", "update_from_output", ("scheduler_output", "model_runner_output")
    ),
    UsedMember(_SCHED, "Scheduler", "finish_requests", ("request_ids", "finished_status")),
    UsedMember(_SCHED, "Scheduler", "_preempt_request", ("request",), forwards_rest=True),
    UsedMember(_SCHED, "Scheduler", "_holds_kv_blocks", ("request",)),
    UsedMember(_SCHED, "Scheduler", "shutdown", ()),
    *_attrs(_SCHED, "Scheduler", _SCHEDULER_ATTRS),
    # The waiting queue the plugin stages and restores.
    UsedMember(_QUEUE, "FCFSRequestQueue", "remove_requests", ("requests",)),
    UsedMember(_QUEUE, "FCFSRequestQueue", "prepend_requests", ("requests",)),
    UsedMember(_QUEUE, "FCFSRequestQueue", "__len__", ()),
    UsedMember(_QUEUE, "FCFSRequestQueue", "__iter__", ()),
    # KV facts shown to the policy, and the chunk size the plugin sets.
    *_attrs("vllm/v1/core/kv_cache_manager.py", "KVCacheManager", "block_pool"),
    *_attrs("vllm/v1/core/block_pool.py", "BlockPool", "num_gpu_blocks"),
    UsedMember("vllm/v1/core/block_pool.py", "BlockPool", "get_num_free_blocks", ()),
    *_attrs(
        "vllm/config/scheduler.py",
        "SchedulerConfig",
        "long_prefill_token_threshold enable_chunked_prefill",
    ),
    *_attrs(
        _OUTPUT,
        "SchedulerOutput",
        "total_num_scheduled_tokens num_scheduled_tokens scheduled_new_reqs scheduled_cached_reqs",
    ),
    # The computed tokens of each scheduled request before the step (``step_shape``).
    *_attrs(_OUTPUT, "NewRequestData", "req_id num_computed_tokens"),
    *_attrs(_OUTPUT, "CachedRequestData", "req_ids num_computed_tokens"),
    # Requests as the mirror reads them.
    *_attrs(_REQUEST, "Request", _REQUEST_ATTRS),
    UsedMember(_REQUEST, "Request", "is_finished", ()),
    *_attrs(_REQUEST, "RequestStatus", _STATUSES),
)

# Base classes that must stay in place for the subclasses to work as documented.
REQUIRED_BASES: dict[tuple[str, str], str] = {(_ASYNC, "AsyncScheduler"): "Scheduler"}


def check_source(root: Path) -> list[str]:
    """Every way the vLLM source under ``root`` (the folder holding ``vllm/``) differs from
    what the plugin uses: a missing file, class or member, an attribute that became a
    method or back, a method whose leading parameters changed or that gained a required
    one, a base class dropped. Empty when the plugin's assumptions all hold."""
    problems: list[str] = []
    classes: dict[str, dict[str, ast.ClassDef]] = {}
    for member in USED_MEMBERS:
        found = classes.get(member.path)
        if found is None:
            found = classes[member.path] = _classes(root / member.path)
        where = f"{member.path}: {member.owner}.{member.name}"
        if not found:
            problems.append(f"{member.path}: file missing or empty")
            continue
        if member.owner not in found:
            problems.append(f"{member.path}: class {member.owner} missing")
            continue
        problem = _check_member(found, member)
        if problem is not None:
            problems.append(f"{where}: {problem}")
    for (path, owner), base in REQUIRED_BASES.items():
        cls = _classes(root / path).get(owner)
        if cls is None:
            problems.append(f"{path}: class {owner} missing")
        elif base not in {_name(b) for b in cls.bases}:
            problems.append(f"{path}: {owner} no longer derives from {base}")
    return problems


def _classes(path: Path) -> dict[str, ast.ClassDef]:
    if not path.is_file():
        return {}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript):
        return _name(node.value)
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _lineage(classes: dict[str, ast.ClassDef], owner: str) -> list[ast.ClassDef]:
    """``owner`` and its base classes defined in the same file, nearest first."""
    chain: list[ast.ClassDef] = []
    pending = [owner]
    while pending:
        cls = classes.get(pending.pop(0))
        if cls is not None and cls not in chain:
            chain.append(cls)
            pending.extend(_name(base) for base in cls.bases)
    return chain


def _check_member(classes: dict[str, ast.ClassDef], member: UsedMember) -> str | None:
    for cls in _lineage(classes, member.owner):
        method = _method(cls, member.name)
        if method is not None and not _is_property(method):
            if member.params is None:
                return "is a method, the plugin reads it as an attribute"
            return _check_params(method, member.params, member.forwards_rest)
        if method is not None or _has_attribute(cls, member.name):
            if member.params is not None:
                return "is an attribute, the plugin calls it as a method"
            return None
    if member.params is not None and member.name.startswith("__"):
        return None  # a dunder inherited from a class outside the file (deque, object)
    return "missing"


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node
    return None


def _is_property(method: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(_name(d) in {"property", "cached_property"} for d in method.decorator_list)


def _has_attribute(cls: ast.ClassDef, name: str) -> bool:
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and _name(node.target) == name:
            return True
        if isinstance(node, ast.Assign) and any(_name(t) == name for t in node.targets):
            return True
    for found in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(found, ast.Assign):
            targets = found.targets
        elif isinstance(found, ast.AnnAssign | ast.AugAssign):
            targets = [found.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and target.attr == name
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                return True
    return False


def _check_params(
    method: ast.FunctionDef | ast.AsyncFunctionDef, expected: tuple[str, ...], forwards: bool
) -> str | None:
    arguments = method.args
    positional = [*arguments.posonlyargs, *arguments.args]
    static = any(_name(d) == "staticmethod" for d in method.decorator_list)
    names = [a.arg for a in (positional if static else positional[1:])]
    if tuple(names[: len(expected)]) != expected:
        if arguments.vararg is not None and tuple(names) == expected[: len(names)]:
            return None
        return f"parameters are ({', '.join(names)}), the plugin expects ({', '.join(expected)})"
    num_defaults = len(arguments.defaults)
    required_extra = names[len(expected) : len(names) - num_defaults]
    kw_required = [
        a.arg for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True) if d is None
    ]
    if (required_extra or kw_required) and not forwards:
        return f"gained required parameters {', '.join([*required_extra, *kw_required])}"
    return None
