"""Workflows: parsing, validation messages, UI conversion, and the two runtimes giving equal frames."""
import json

import numpy as np
import pytest
import torch

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.render import runner as rn
from alaya_flash.streaming.render import workflow as wfm


# --- toy nodes following the pack's node protocol --------------------------------------------


class CountSource:
    """Frames 0..n-1 as (T, 2) float tensors, `chunk` frames per tick."""

    STREAM = "source"
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"frames": ("INT", {"default": 10, "min": 1, "max": 1000}),
                             "chunk": ("INT", {"default": 4, "min": 1, "max": 64})}}

    def open_stream(self, frames, chunk):
        for s in range(0, frames, chunk):
            idx = torch.arange(s, min(s + chunk, frames), dtype=torch.float32)
            yield (torch.stack([idx, idx * idx], 1),)

    load = rn.run_source_whole


class BlockMix:
    """Stateful: emits frames in blocks of `block`, each mixed with the previous block's mean
    (so the output depends on state carried across chunks, and on internal buffering)."""

    STREAM = "stage"
    STREAM_INPUTS = ("images",)
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "mix"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE",), "block": ("INT", {"default": 3, "min": 1}),
                             "seed": ("INT", {"default": 0, "min": 0})}}

    def start_stream(self, block, seed):
        return _BlockMixState(block, seed)

    mix = rn.run_stage_whole


class _BlockMixState:
    def __init__(self, block, seed):
        self.block, self.buf, self.prev = block, [], torch.zeros(2)
        self.gen = torch.Generator().manual_seed(seed)

    def _emit(self, frames):
        out = frames + self.prev + torch.rand(frames.shape, generator=self.gen)
        self.prev = frames.mean(0)
        return out

    def step(self, images):
        self.buf.extend(images)
        outs = []
        while len(self.buf) >= self.block:
            outs.append(self._emit(torch.stack(self.buf[: self.block])))
            del self.buf[: self.block]
        return (torch.cat(outs) if outs else None,)

    def flush(self):
        out = self._emit(torch.stack(self.buf)) if self.buf else None
        self.buf = []
        return (out,)


class Collect:
    STREAM = "stage"
    STREAM_INPUTS = ("images",)
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "save"
    sink: list = []

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE",), "name": ("STRING", {"default": "out"}),
                             "mode": (["fast", "slow"],)}}

    def start_stream(self, name, mode):
        return _CollectState(name)

    save = rn.run_stage_whole


class _CollectState:
    def __init__(self, name):
        self.name, self.parts, self.aborted = name, [], False

    def step(self, images):
        if images is not None:
            self.parts.append(images.clone())

    def flush(self):
        Collect.sink.append((self.name, torch.cat(self.parts)))
        return {"ui": {"frames": [sum(len(p) for p in self.parts)]}}

    def abort(self):
        Collect.sink.append((self.name, "aborted"))


class Failing(BlockMix):
    def start_stream(self, block, seed):
        state = _BlockMixState(block, seed)

        def step(images):
            raise RuntimeError("boom")

        state.step = step
        return state


CLASSES = {"Count": CountSource, "Mix": BlockMix, "Collect": Collect, "Failing": Failing}


def api_graph(chunk=4, block=3, frames=10):
    return {
        "1": {"class_type": "Count", "inputs": {"frames": frames, "chunk": chunk}},
        "2": {"class_type": "Mix", "inputs": {"images": ["1", 0], "block": block, "seed": 7}},
        "3": {"class_type": "Collect", "inputs": {"images": ["2", 0], "name": "a", "mode": "fast"}},
    }


@pytest.fixture(autouse=True)
def clear_sink():
    Collect.sink.clear()


# --- two runtimes ---------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 2, 4, 10])
def test_chunked_run_equals_whole_run(chunk):
    whole_wf = wfm.parse_workflow(api_graph(chunk=10), CLASSES)
    rn.execute_whole(whole_wf, CLASSES)
    (_, whole), = Collect.sink
    Collect.sink.clear()
    stats = rn.StreamRunner(wfm.parse_workflow(api_graph(chunk=chunk), CLASSES), CLASSES).run()
    (_, chunked), = Collect.sink
    assert stats.frames == 10 and stats.ticks == -(-10 // chunk)
    assert chunked.shape == (10, 2)
    assert torch.equal(chunked, whole)


@pytest.mark.parametrize("chunk", [1, 3])
def test_run_on_lanes_equals_whole_run(chunk):
    """The stream nodes on two worker lanes (the CLI's default on a CPU) give the whole run's frames."""
    from alaya_flash.streaming.render.driver import Lanes

    rn.execute_whole(wfm.parse_workflow(api_graph(chunk=10), CLASSES), CLASSES)
    (_, whole), = Collect.sink
    Collect.sink.clear()
    stats = rn.StreamRunner(wfm.parse_workflow(api_graph(chunk=chunk), CLASSES), CLASSES, lanes=Lanes()).run()
    (_, piped), = Collect.sink
    assert stats.frames == 10 and stats.ticks == -(-10 // chunk)
    assert torch.equal(piped, whole)


@pytest.mark.parametrize("lanes", [False, True])
def test_abort_runs_on_failure(lanes):
    from alaya_flash.streaming.render.driver import Lanes

    g = api_graph()
    g["2"]["class_type"] = "Failing"
    with pytest.raises(RuntimeError, match="boom"):
        rn.StreamRunner(wfm.parse_workflow(g, CLASSES), CLASSES, lanes=Lanes() if lanes else None).run()
    assert Collect.sink == [("a", "aborted")]


def test_sync_bills_asynchronous_work_to_the_node_that_queued_it():
    """bench passes torch.cuda.synchronize: work a node queued (here: a wait that Mix queues and
    sync performs) is timed inside that node's step, not the next node's."""
    import time

    queued = []

    class QueuingMix(BlockMix):
        def start_stream(self, block, seed):
            state = super().start_stream(block, seed)
            inner = state.step

            def step(images):
                queued.append(0.02)
                return inner(images)

            state.step = step
            return state

    def sync():
        while queued:
            time.sleep(queued.pop())

    classes = {**CLASSES, "Mix": QueuingMix}
    stats = rn.StreamRunner(wfm.parse_workflow(api_graph(chunk=4), classes), classes, sync=sync).run()
    assert stats.ticks == 3 and stats.node_seconds["2"] >= 0.02 * stats.ticks
    assert stats.node_seconds["3"] < 0.02  # the sink waited for nothing it did not queue
    assert not queued


# --- reading and validation -------------------------------------------------------------------


def test_malformed_json_names_line_and_column(tmp_path):
    p = tmp_path / "w.json"
    p.write_text('{\n  "1": {"class_type": "Count",\n  }\n}')
    with pytest.raises(AlayaError, match=r"w\.json: malformed JSON at line 3, column 3"):
        wfm.load_workflow(p, CLASSES)


def test_every_problem_reported_with_node_and_input():
    g = api_graph()
    g["1"]["inputs"]["frames"] = 0  # out of range
    g["1"]["inputs"]["colour"] = 1  # unknown input
    del g["2"]["inputs"]["block"]  # missing
    g["3"]["inputs"]["mode"] = "medium"  # bad combo
    g["4"] = {"class_type": "Nope", "inputs": {}}
    g["5"] = {"class_type": "Collect", "inputs": {"images": ["9", 0], "name": "b", "mode": "fast"}}
    with pytest.raises(wfm.WorkflowError) as err:
        wfm.validate(wfm.parse_workflow(g, CLASSES), CLASSES)
    text = "\n".join(err.value.problems)
    assert "node 1 (Count): input 'frames' is 0, out of range [1, 1000]" in text
    assert "node 1 (Count): unknown input 'colour'" in text
    assert "node 2 (Mix): missing required input 'block'" in text
    assert "node 3 (Collect): input 'mode' is 'medium', not one of: fast, slow" in text
    assert "node 4 (Nope): unknown node type 'Nope'" in text
    assert "node 5 (Collect): input 'images' links to node 9, which does not exist" in text
    assert len(err.value.problems) == 6


def test_type_mismatch_bad_output_cycle_and_no_output():
    g = api_graph()
    g["2"]["inputs"]["block"] = ["1", 0]  # IMAGE into INT
    g["3"]["inputs"]["images"] = ["2", 3]
    with pytest.raises(wfm.WorkflowError) as err:
        wfm.validate(wfm.parse_workflow(g, CLASSES), CLASSES)
    text = "\n".join(err.value.problems)
    assert "node 2 (Mix): input 'block' expects INT but node 1 (Count) output 0 gives IMAGE" in text
    assert "links to output 3 of node 2 (Mix), which has 1 output(s)" in text
    g = api_graph()
    g["1"] = {"class_type": "Mix", "inputs": {"images": ["2", 0], "block": 1, "seed": 0}}
    with pytest.raises(wfm.WorkflowError, match=r"cycle through nodes 1 -> 2 -> 1"):
        wfm.validate(wfm.parse_workflow(g, CLASSES), CLASSES)
    g = api_graph()
    del g["3"]
    with pytest.raises(wfm.WorkflowError, match="no output node"):
        wfm.validate(wfm.parse_workflow(g, CLASSES), CLASSES)


def test_stream_into_run_once_input_is_refused():
    class Peek:  # a plain node: runs once, over whole sequences
        RETURN_TYPES = ()
        OUTPUT_NODE = True
        FUNCTION = "peek"

        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"images": ("IMAGE",)}}

    classes = dict(CLASSES, Peek=Peek)
    g = api_graph()
    g["4"] = {"class_type": "Peek", "inputs": {"images": ["2", 0]}}
    with pytest.raises(wfm.WorkflowError, match="node 4 \\(Peek\\): input 'images' receives a stream, but this node runs once"):
        rn.StreamRunner(wfm.parse_workflow(g, classes), classes)


def test_ui_format_converts_widgets_and_links():
    ui = {
        "last_node_id": 3, "last_link_id": 2, "version": 0.4, "groups": [], "config": {}, "extra": {},
        "nodes": [
            {"id": 1, "type": "Count", "mode": 0, "inputs": [], "outputs": [{"name": "IMAGE", "type": "IMAGE", "links": [1]}],
             "widgets_values": [10, 4]},
            # seed has an extra frontend control value ("fixed") after it
            {"id": 2, "type": "Mix", "mode": 0, "inputs": [{"name": "images", "type": "IMAGE", "link": 1}],
             "outputs": [{"name": "IMAGE", "type": "IMAGE", "links": [2]}], "widgets_values": [3, 7, "fixed"]},
            {"id": 3, "type": "Collect", "mode": 0, "inputs": [{"name": "images", "type": "IMAGE", "link": 2}],
             "outputs": [], "widgets_values": ["a", "fast"]},
            {"id": 4, "type": "Nope", "mode": 2, "inputs": [], "outputs": [], "widgets_values": []},
        ],
        "links": [[1, 1, 0, 2, 0, "IMAGE"], [2, 2, 0, 3, 0, "IMAGE"]],
    }
    wf = wfm.parse_workflow(ui, CLASSES, "ui.json")
    assert wf.format == "ui"
    assert wf.to_api() == {k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in api_graph().items()}


def test_overrides_parse_by_input_type():
    wf = wfm.parse_workflow(api_graph(), CLASSES)
    wfm.apply_overrides(wf, ["2.seed=11", "Collect.name=run7"], CLASSES)
    assert wf.nodes["2"].inputs["seed"] == 11 and wf.nodes["3"].inputs["name"] == "run7"
    with pytest.raises(wfm.WorkflowError) as err:
        wfm.apply_overrides(wf, ["2.seed=eleven", "9.x=1", "bad"], CLASSES)
    assert len(err.value.problems) == 3
