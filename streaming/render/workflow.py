"""Saved workflows: read ComfyUI's API and UI formats, apply overrides, validate, order.

A workflow is a graph of node instances. In API format (what ComfyUI's "Export (API)" writes)
every node is `{"class_type": ..., "inputs": {name: literal | [source_id, output_index]}}`.
UI format (what the canvas saves) is converted to the same form using the node classes'
INPUT_TYPES, so widget values land on the right names.

Validation happens before any work and reports every problem, one line each, naming the node id
and input: unknown node type, missing or unknown input, link to a missing node or output, type
mismatch, cycle, value out of range or of the wrong kind, and whatever a node's VALIDATE_INPUTS
reports (e.g. a missing model file with the folders searched).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ...model_zoo.errors import AlayaError

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN"}
SEED_NAMES = {"seed", "noise_seed"}  # the ComfyUI frontend stores a control value after these


class WorkflowError(AlayaError):
    """A workflow that cannot run; the message lists every problem, one per line."""

    def __init__(self, source: str, problems: list[str]):
        self.source, self.problems = source, problems
        head = f"{source}: {len(problems)} problem{'s' if len(problems) != 1 else ''}"
        super().__init__(head + "".join(f"\n  {p}" for p in problems))


@dataclass(frozen=True)
class Link:
    """An input fed by output `output` of node `node`."""

    node: str
    output: int


@dataclass
class NodeSpec:
    class_type: str
    inputs: dict[str, Any]
    title: str = ""

    def label(self, node_id: str) -> str:
        return f"node {node_id} ({self.title or self.class_type})"


@dataclass
class Workflow:
    nodes: dict[str, NodeSpec]
    source: str = "workflow"
    format: str = "api"
    meta: dict = field(default_factory=dict)

    def to_api(self) -> dict:
        """Back to API format (a JSON-able dict), e.g. to queue on a ComfyUI server."""
        out = {}
        for nid, spec in self.nodes.items():
            inputs = {k: [v.node, v.output] if isinstance(v, Link) else v for k, v in spec.inputs.items()}
            out[nid] = {"class_type": spec.class_type, "inputs": inputs}
            if spec.title:
                out[nid]["_meta"] = {"title": spec.title}
        return out


# ---------------------------------------------------------------------------------------------
# Reading.


def load_workflow(path: str | Path, node_classes: Mapping[str, type]) -> Workflow:
    """Read an API- or UI-format workflow file (format detected from its shape)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AlayaError(f"{path}: no such workflow file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise AlayaError(f"{path}: cannot read workflow ({err})") from None
    duplicates: list[str] = []

    def no_duplicate_ids(pairs):
        keys = [k for k, _ in pairs]
        duplicates.extend(sorted({k for k in keys if keys.count(k) > 1}))
        return dict(pairs)

    try:
        data = json.loads(text, object_pairs_hook=no_duplicate_ids)
    except json.JSONDecodeError as err:
        raise AlayaError(f"{path}: malformed JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    except RecursionError:
        raise AlayaError(f"{path}: JSON nested too deeply to be a workflow") from None
    if duplicates and isinstance(data, dict) and not ("nodes" in data and "links" in data):
        # in API format the keys are node ids: JSON keeps only the last of a repeated one
        raise AlayaError(f"{path}: node id(s) {', '.join(map(repr, duplicates))} appear more than once")
    return parse_workflow(data, node_classes, str(path))


def parse_workflow(data: Any, node_classes: Mapping[str, type], source: str = "workflow") -> Workflow:
    if isinstance(data, dict) and isinstance(data.get("nodes"), list) and "links" in data:
        return _from_ui(data, node_classes, source)
    if isinstance(data, dict) and isinstance(data.get("prompt"), dict):  # a /prompt request body
        data = data["prompt"]
    if isinstance(data, dict) and data and all(isinstance(v, dict) and "class_type" in v for v in data.values()):
        return _from_api(data, source)
    raise AlayaError(f"{source}: neither an API-format workflow nor a UI-format workflow")


def _from_api(data: dict, source: str) -> Workflow:
    nodes = {}
    for nid, node in data.items():
        inputs = {}
        for name, value in (node.get("inputs") or {}).items():
            is_link = isinstance(value, list) and len(value) == 2 and isinstance(value[1], int) and not isinstance(value[1], bool)
            inputs[name] = Link(str(value[0]), value[1]) if is_link else value
        title = (node.get("_meta") or {}).get("title", "")
        nodes[str(nid)] = NodeSpec(str(node["class_type"]), inputs, title)
    return Workflow(nodes, source, "api")


def widget_inputs(cls: type) -> list[tuple[str, tuple]]:
    """(name, spec) of every input shown as a widget, in the order the canvas stores them."""
    types = cls.INPUT_TYPES()
    out = []
    for section in ("required", "optional"):
        for name, spec in (types.get(section) or {}).items():
            kind = spec[0]
            opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
            if (isinstance(kind, (list, tuple)) or kind in WIDGET_TYPES) and not opts.get("forceInput"):
                out.append((name, spec))
    return out


def _has_control_value(name: str, spec: tuple) -> bool:
    opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    return spec[0] == "INT" and (name in SEED_NAMES or bool(opts.get("control_after_generate")))


def _from_ui(data: dict, node_classes: Mapping[str, type], source: str) -> Workflow:
    problems = []
    links = {}
    for link in data.get("links") or []:
        if isinstance(link, dict):  # newer frontends may save links as objects
            link = [link.get("id"), link.get("origin_id"), link.get("origin_slot"), link.get("target_id"), link.get("target_slot"), link.get("type")]
        links[link[0]] = link
    nodes = {}
    ids = [str(n.get("id")) if isinstance(n, dict) else None for n in data["nodes"]]
    repeated = sorted({i for i in ids if ids.count(i) > 1 and i is not None})
    if None in ids:
        raise WorkflowError(source, ["the 'nodes' list holds an entry that is not a node object"])
    if repeated:
        raise WorkflowError(source, [f"node id {i} appears {ids.count(i)} times in 'nodes'" for i in repeated])
    for node in data["nodes"]:
        nid, ntype = str(node.get("id")), node.get("type")
        if node.get("mode") in (2, 4):  # muted / bypassed nodes do not run
            continue
        spec = NodeSpec(str(ntype), {}, node.get("title", ""))
        nodes[nid] = spec
        linked = {}
        for inp in node.get("inputs") or []:
            if inp.get("link") is not None:
                link = links.get(inp["link"])
                if link is None:
                    problems.append(f"node {nid} ({ntype}): input {inp.get('name')!r} uses link {inp['link']}, which the file does not define")
                    continue
                linked[inp["name"]] = Link(str(link[1]), int(link[2]))
        cls = node_classes.get(ntype)
        if cls is None:
            spec.inputs.update(linked)  # reported as an unknown type by validate()
            continue
        if not isinstance(node.get("widgets_values") or [], (list, dict)):
            problems.append(f"node {nid} ({ntype}): widgets_values must be a list or an object, got "
                            f"{type(node['widgets_values']).__name__}")
            continue
        values = list(node.get("widgets_values") or [])
        if isinstance(node.get("widgets_values"), dict):  # some nodes save widgets by name
            values_by_name = node["widgets_values"]
            for name, _ in widget_inputs(cls):
                if name in values_by_name:
                    spec.inputs[name] = values_by_name[name]
        else:
            i = 0
            for name, wspec in widget_inputs(cls):
                if i < len(values):
                    spec.inputs[name] = values[i]
                i += 1
                if _has_control_value(name, wspec):
                    i += 1
        spec.inputs.update(linked)
    if problems:
        raise WorkflowError(source, problems)
    return Workflow(nodes, source, "ui", meta={"extra": data.get("extra", {})})


# ---------------------------------------------------------------------------------------------
# Overrides: --set NODE.INPUT=VALUE


def apply_overrides(wf: Workflow, assignments: list[str], node_classes: Mapping[str, type]) -> None:
    """Set widget values from 'NODE.INPUT=VALUE' strings; NODE is an id or a unique title."""
    problems = []
    for text in assignments:
        target, sep, raw = text.partition("=")
        node_ref, dot, name = target.partition(".")
        if not sep or not dot or not name:
            problems.append(f"--set {text!r}: expected NODE.INPUT=VALUE")
            continue
        nid = _find_node(wf, node_ref)
        if nid is None:
            problems.append(f"--set {text!r}: no node with id or title {node_ref!r}")
            continue
        spec = _input_spec(node_classes.get(wf.nodes[nid].class_type), name)
        try:
            wf.nodes[nid].inputs[name] = _parse_value(raw, spec)
        except ValueError as err:
            problems.append(f"--set {text!r}: {err}")
    if problems:
        raise WorkflowError(wf.source, problems)


def _find_node(wf: Workflow, ref: str) -> str | None:
    if ref in wf.nodes:
        return ref
    by_title = [nid for nid, s in wf.nodes.items() if s.title == ref or s.class_type == ref]
    return by_title[0] if len(by_title) == 1 else None


def _input_spec(cls: type | None, name: str) -> tuple | None:
    if cls is None:
        return None
    types = cls.INPUT_TYPES()
    for section in ("required", "optional"):
        if name in (types.get(section) or {}):
            return types[section][name]
    return None


def _parse_value(raw: str, spec: tuple | None):
    kind = spec[0] if spec else None
    if kind == "INT":
        return int(raw)
    if kind == "FLOAT":
        return float(raw)
    if kind == "BOOLEAN":
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{raw!r} is not a boolean")
    if kind is None:
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


LIGHT_TYPE, LIGHT_NODE = "ALAYA_LIGHT", "AlayaFlash_Light"


def feed_light(wf: Workflow, text: str, node_classes: Mapping[str, type], title: str = "--light") -> list[str]:
    """Render the workflow under a light given as text (`--light`: one light or 'FRAME: light' lines): a Light
    node with that text is added (titled `title`) and linked to every LIGHT input of the graph (Encode
    G-Buffers, Refine with G-Buffers, Render G-Buffer Stream, Shade G-Buffers), replacing what fed them (an
    explicit light wins).
    Returns the fed node ids; AlayaError naming `title` for a wrong light or a graph with no LIGHT input."""
    from .lighting import user_lights

    user_lights(text, title)  # a wrong light is one line naming the flag, before the graph is touched
    fed = [nid for nid, spec in wf.nodes.items() if _light_inputs(node_classes.get(spec.class_type))]
    if not fed:
        raise AlayaError(f"{title}: {wf.source} has no node that takes a light (Encode G-Buffers, Refine with "
                         "G-Buffers, Render G-Buffer Stream, Shade G-Buffers)")
    cls = node_classes[LIGHT_NODE]
    inputs = {name: spec[1]["default"] for name, spec in widget_inputs(cls) if "default" in (spec[1] if len(spec) > 1 else {})}
    numbers = [int(n) for n in wf.nodes if n.isdigit()]
    light_id = str(max(numbers, default=0) + 1)
    wf.nodes[light_id] = NodeSpec(LIGHT_NODE, {**inputs, "text": text}, title)
    for nid in fed:
        for name in _light_inputs(node_classes[wf.nodes[nid].class_type]):
            wf.nodes[nid].inputs[name] = Link(light_id, 0)
    return fed


def _light_inputs(cls: type | None) -> list[str]:
    if cls is None:
        return []
    types = cls.INPUT_TYPES()
    return [name for section in ("required", "optional") for name, spec in (types.get(section) or {}).items()
            if spec[0] == LIGHT_TYPE]


# ---------------------------------------------------------------------------------------------
# Validation and order.


def _types_match(produced: str, wanted: str) -> bool:
    if "*" in (produced, wanted):
        return True
    return bool(set(produced.split(",")) & set(wanted.split(",")))


def _check_value(label: str, name: str, value: Any, spec: tuple, custom: bool = False) -> str | None:
    """A literal input against its spec. custom: the node's VALIDATE_INPUTS checks its values (as in
    ComfyUI), so only the type is checked here, which that method may take for granted."""
    kind = spec[0]
    opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    if isinstance(kind, (list, tuple)) and custom:  # any value of the choices' type (e.g. a file path)
        types = tuple({type(c) for c in kind}) or (str,)
        return None if isinstance(value, types) and not isinstance(value, bool) else \
            f"{label}: input {name!r} must be a {' or '.join(t.__name__ for t in types)} like its choices, got {value!r:.60}"
    if isinstance(kind, (list, tuple)):
        if value not in kind:
            shown = ", ".join(map(str, list(kind)[:8])) + (", ..." if len(kind) > 8 else "")
            return f"{label}: input {name!r} is {value!r}, not one of: {shown}"
        return None
    if kind == "INT" and (isinstance(value, bool) or not isinstance(value, int)):
        return f"{label}: input {name!r} must be an integer, got {value!r}"
    if kind == "FLOAT" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return f"{label}: input {name!r} must be a number, got {value!r}"
    if kind == "BOOLEAN" and not isinstance(value, bool):
        return f"{label}: input {name!r} must be true or false, got {value!r}"
    if kind == "STRING" and not isinstance(value, str):
        return f"{label}: input {name!r} must be a string, got {value!r}"
    if kind == "FLOAT" and not math.isfinite(value):
        return f"{label}: input {name!r} must be a finite number, got {value!r}"
    if kind in ("INT", "FLOAT") and not custom:
        lo, hi = opts.get("min"), opts.get("max")
        if lo is not None and value < lo or hi is not None and value > hi:
            return f"{label}: input {name!r} is {value}, out of range [{lo}, {hi}]"
    if kind not in WIDGET_TYPES and not isinstance(kind, (list, tuple)):
        return f"{label}: input {name!r} needs a link from a {kind} output, got the value {value!r:.60}"
    return None


def validate(wf: Workflow, node_classes: Mapping[str, type]) -> list[str]:
    """Return the execution order; raise WorkflowError listing every problem."""
    problems: list[str] = []
    for nid, spec in wf.nodes.items():
        label = spec.label(nid)
        cls = node_classes.get(spec.class_type)
        if cls is None:
            known = ", ".join(sorted(node_classes)[:12])
            problems.append(f"{label}: unknown node type {spec.class_type!r} (known: {known}{', ...' if len(node_classes) > 12 else ''})")
            continue
        types = cls.INPUT_TYPES()
        required = types.get("required") or {}
        optional = types.get("optional") or {}
        hidden = types.get("hidden") or {}
        for name in required:
            if name not in spec.inputs:
                problems.append(f"{label}: missing required input {name!r}")
        literals = {}
        for name, value in spec.inputs.items():
            if name not in required and name not in optional:
                if name not in hidden:
                    problems.append(f"{label}: unknown input {name!r} (inputs: {', '.join(list(required) + list(optional))})")
                continue
            want = (required.get(name) or optional.get(name))
            if isinstance(value, Link):
                src = wf.nodes.get(value.node)
                src_cls = node_classes.get(src.class_type) if src else None
                if src is None:
                    problems.append(f"{label}: input {name!r} links to node {value.node}, which does not exist")
                elif src_cls is not None:
                    outs = src_cls.RETURN_TYPES
                    if not 0 <= value.output < len(outs):
                        problems.append(f"{label}: input {name!r} links to output {value.output} of {src.label(value.node)}, which has {len(outs)} output(s)")
                    elif isinstance(want[0], str) and not _types_match(outs[value.output], want[0]):
                        problems.append(f"{label}: input {name!r} expects {want[0]} but {src.label(value.node)} output {value.output} gives {outs[value.output]}")
                    elif isinstance(want[0], (list, tuple)) and outs[value.output] not in ("*", "COMBO", "STRING", "INT", "FLOAT"):
                        problems.append(f"{label}: input {name!r} is a choice but {src.label(value.node)} output {value.output} gives {outs[value.output]}")
            else:
                custom = (hasattr(cls, "VALIDATE_INPUTS") and name in _validate_params(cls)
                          or hasattr(cls, "check_values") and name in _validate_params(cls, "check_values"))
                msg = _check_value(label, name, value, want, custom)
                if msg:
                    problems.append(msg)
                else:
                    literals[name] = value
        if hasattr(cls, "VALIDATE_INPUTS") and _required_params(cls) <= set(literals):  # else: reported already
            params = _validate_params(cls)
            kwargs = {k: v for k, v in literals.items() if "**" in params or k in params}
            result = cls.VALIDATE_INPUTS(**kwargs)
            if result is not True:  # ComfyUI takes one string: the nodes put one problem per line
                problems += [f"{label}: {part}" for part in str(result).splitlines()]
        check = getattr(cls, "check_values", None)  # what a node checks when it starts (ComfyUI validates less)
        if check is not None and _required_params(cls, "check_values") <= set(literals):
            params = _validate_params(cls, "check_values")
            problems += [f"{label}: {p}" for p in check(**{k: v for k, v in literals.items() if k in params}) if p]
    order: list[str] = []
    if not any(p for p in problems if "links to node" in p or "unknown node type" in p):
        order, cycle = _topo_order(wf)
        if cycle:
            problems.append("cycle through nodes " + " -> ".join(cycle))
        outputs = [nid for nid, s in wf.nodes.items() if getattr(node_classes.get(s.class_type), "OUTPUT_NODE", False)]
        if not outputs:
            problems.append("the workflow has no output node (Save, Preview, ...), so nothing would run")
    if problems:
        raise WorkflowError(wf.source, problems)
    return order


def _required_params(cls: type, method: str = "VALIDATE_INPUTS") -> set[str]:
    """The method's parameters without a default: it can only run when they have values."""
    import inspect

    return {p.name for p in inspect.signature(getattr(cls, method)).parameters.values()
            if p.default is p.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def _validate_params(cls: type, method: str = "VALIDATE_INPUTS") -> set[str]:
    import inspect

    sig = inspect.signature(getattr(cls, method))
    names = {p.name for p in sig.parameters.values() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        names.add("**")
    return names


def _topo_order(wf: Workflow) -> tuple[list[str], list[str]]:
    """Kahn's order over links; on a cycle, return the nodes of one cycle."""
    deps = {nid: {v.node for v in s.inputs.values() if isinstance(v, Link)} for nid, s in wf.nodes.items()}
    order, done = [], set()
    pending = sorted(deps, key=_id_key)
    while pending:
        ready = [n for n in pending if deps[n] <= done]
        if not ready:
            return order, _find_cycle(deps, pending)
        for n in ready:
            order.append(n)
            done.add(n)
        pending = [n for n in pending if n not in done]
    return order, []


def _find_cycle(deps: dict[str, set[str]], pending: list[str]) -> list[str]:
    start = pending[0]
    path, seen = [start], {start}
    node = start
    while True:
        node = sorted(d for d in deps[node] if d in pending)[0]
        if node in seen:
            return path[path.index(node):] + [node]
        path.append(node)
        seen.add(node)


def _id_key(nid: str):
    return (0, int(nid), "") if nid.isdigit() else (1, 0, nid)


def upstream_of(wf: Workflow, targets: list[str]) -> set[str]:
    """Every node that the given nodes depend on (inclusive): what actually has to run."""
    needed, stack = set(), list(targets)
    while stack:
        nid = stack.pop()
        if nid in needed:
            continue
        needed.add(nid)
        stack.extend(v.node for v in wf.nodes[nid].inputs.values() if isinstance(v, Link))
    return needed
