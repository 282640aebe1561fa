"""Tools and the ``tool_agent`` workflow: the calculator, the python sandbox, tool-call parsing, the tool config
file, and whole episodes (a scripted engine for the tool path, the real tiny model for the plain path)."""

import asyncio
import re
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from trinity_like.algorithms.rewards import load_reward_manager
from trinity_like.common.errors import UserError
from trinity_like.common.tasks import Task
from trinity_like.common.tokenizer import hf_tokenizer
from trinity_like.config import EvalTasksetConfig, RewardConfig, SamplingConfig
from trinity_like.config.tools import BUILTIN_TOOLS
from trinity_like.explorer.engines.base import Sample
from trinity_like.explorer.engines.hf_engine import HFEngine
from trinity_like.explorer.evaluation import evaluate
from trinity_like.explorer.tool_workflow import ToolAgentWorkflow, episode_prompt
from trinity_like.explorer.tools import (
    TOOLS,
    CalculatorTool,
    PythonTool,
    ToolCall,
    ToolResult,
    load_tools,
    parse_tool_calls,
    tool_metrics,
)
from trinity_like.explorer.workflows import WorkflowContext, load_workflow

SANDBOX = "bwrap" if shutil.which("bwrap") else "guard"
"""The python tool of ``TOOLS_YAML`` runs under bubblewrap where it is installed, else under the weaker guard, so
the workflow tests run on either machine."""

TOOLS_YAML = """\
tools:
  - class_name: calculator
    config: {max_exponent: 10}
    tool_schema:
      type: function
      function:
        name: calculator
        description: Evaluate an arithmetic expression.
        parameters: {type: object, properties: {expression: {type: string}}, required: [expression]}
  - class_name: verl.tools.python_tool.PythonTool
    config: {type: native, timeout_s: 3, sandbox: SANDBOX}
    tool_schema:
      type: function
      function:
        name: python
        description: Run Python code and return what it prints.
        parameters: {type: object, properties: {code: {type: string}}, required: [code]}
""".replace("SANDBOX", SANDBOX)


# ---------------------------------------------------------------- calculator


@pytest.fixture(scope="module")
def calc():
    return CalculatorTool(CalculatorTool.Config())


@pytest.mark.parametrize("expression, text", [
    ("3+4", "7"),
    ("12*7", "84"),
    ("-(3-5)*2", "4"),       # -(-2) * 2
    ("7/2", "3.5"),
    ("6/3", "2"),            # a float result that is whole prints without ".0"
    ("7//2", "3"),
    ("-7//2", "-4"),         # floor division rounds down
    ("17%5", "2"),
    ("2**10", "1024"),
    ("2**-2", "0.25"),
    ("(1+2)*(3+4)", "21"),
    ("1/3", "0.333333333333"),  # 12 significant digits
])
def test_calculator_values(calc, expression, text):
    result = calc({"expression": expression})
    assert result.ok and result.text == text and result.error is None


@pytest.mark.parametrize("expression, says", [
    ("x+1", "names are not allowed"),
    ("__import__('os')", "function calls are not allowed"),
    ("abs(-1)", "function calls are not allowed"),
    ("(1).real", "Attribute is not allowed"),
    ("'a'*3", "only numbers are allowed"),
    ("True+1", "only numbers are allowed"),
    ("1/0", "division by zero"),
    ("5%0", "division by zero"),
    ("9**9**9", "exponent 387420489 is larger than 100"),  # refused before it is computed
    ("10**19", "result larger than 1e+18"),                 # 19 * log10(10) > 18
    ("10**9*10**10", "result larger than 1e+18"),           # each factor is fine, the product is not
    ("(-8)**0.5", "not a real number"),
    ("3+", "not an arithmetic expression"),
])
def test_calculator_refusals(calc, expression, says):
    start = time.perf_counter()
    result = calc({"expression": expression})
    assert not result.ok and result.error == "error" and says in result.text
    assert time.perf_counter() - start < 1.0


def test_calculator_needs_its_argument(calc):
    assert calc({"expr": "1+1"}).error == "bad_call"
    assert calc({"expression": 3}).error == "bad_call"
    assert "longer than" in calc({"expression": "1+" * 300 + "1"}).text  # 601 characters > max_length 500


# ---------------------------------------------------------------- python, sandbox: guard
# (the bubblewrap sandbox, the default, has tests of its own: test_python_sandbox.py)


@pytest.fixture(scope="module")
def python():
    """The tool as the tests of what code may do use it: a timeout no loaded machine reaches (a fresh-clone run
    at load 9 took over 2 s to start the interpreter and import pathlib); the timeout tests use ``quick``."""
    return PythonTool(PythonTool.Config(timeout_s=30, memory_mb=256, sandbox="guard"))


@pytest.fixture(scope="module")
def quick():
    return PythonTool(PythonTool.Config(timeout_s=2, memory_mb=256, sandbox="guard"))


def test_python_returns_what_it_prints(python):
    assert python({"code": "print(6 * 7)\nprint('done')"}) == _ok("42\ndone")
    assert python({"code": "x = 1"}) == _ok("(no output)")
    long = PythonTool(PythonTool.Config(max_output_chars=50, sandbox="guard"))({"code": "print('a' * 80)"})
    assert long.ok and long.text == "a" * 50 + "\n... [30 more characters cut]"  # 80 - 50 cut


def _ok(text):
    return ToolResult(True, text, None)


def test_python_errors_come_back_as_text(python):
    result = python({"code": "1/0"})
    assert not result.ok and result.error == "error" and result.text.endswith("ZeroDivisionError: division by zero")
    assert python({"code": "import sys; sys.exit(3)"}).text == "exited with status 3"


def test_python_timeout_is_enforced(quick):
    start = time.perf_counter()
    result = quick({"code": "while True: pass"})
    assert time.perf_counter() - start < 2 + 2  # timeout_s + 2
    assert not result.ok and result.error == "timeout" and "timed out after 2 s" in result.text


def test_python_timeout_kills_what_it_started(quick, tmp_path):
    marker = tmp_path / "child-alive"
    grandchild = f"import time; time.sleep(3); open({str(marker)!r}, 'w')"  # plain Python: no write guard
    code = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {grandchild!r}])\nwhile True: pass"
    assert quick({"code": code}).error == "timeout"
    time.sleep(3.5)
    assert not marker.exists()  # the grandchild died with the process group


def test_python_memory_hog_fails(python):
    result = python({"code": "x = bytearray(1024 * 1024 * 1024)\nprint('allocated')"})  # 1 GiB > 256 MiB
    assert not result.ok and result.error == "error" and "MemoryError" in result.text
    assert "allocated" not in result.text


def test_python_writes_only_inside_its_directory(python, tmp_path):
    outside = tmp_path / "escape.txt"
    inside = python({"code": "open('note.txt', 'w').write('hi')\nprint(open('note.txt').read())"})
    assert inside == _ok("hi")
    for code in (f"open({str(outside)!r}, 'w').write('x')",
                 f"import pathlib; pathlib.Path({str(outside)!r}).write_text('x')",
                 f"import os; os.open({str(outside)!r}, os.O_WRONLY | os.O_CREAT)"):
        result = python({"code": code})
        assert not result.ok and "writing outside the sandbox directory is not allowed" in result.text
    assert not outside.exists()


def test_python_has_no_network(python):
    with socket.socket() as server:  # a real listener in this process, reachable from any process but the tool's
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        result = python({"code": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"})
        assert not result.ok and result.error == "error"
        assert "network access is disabled" in result.text or "unreachable" in result.text
    # the in-process guard holds whether or not the kernel gave the child a network namespace
    assert "network access is disabled" in python({"code": "import socket; socket.socket()"}).text


def test_python_directory_is_removed_and_environment_is_bare(python):
    result = python({"code": "import os; print(os.getcwd()); print(sorted(os.environ))"})
    workdir, env = result.text.splitlines()
    assert Path(workdir).name == "work" and not Path(workdir).parent.exists()  # the whole box is gone
    assert env == "['HOME', 'LANG', 'PATH']"  # nothing of the parent's environment (keys) leaks in


# ---------------------------------------------------------------- tool calls in model text


def test_parse_several_calls_and_the_bad_ones():
    text = ('I will compute. <tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>\n'
            '<tool_call> {"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"} </tool_call>'
            '<tool_call>{name: calculator}</tool_call>'
            '<tool_call>["calculator"]</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": {')
    calls = parse_tool_calls(text)
    assert calls[0] == ToolCall("calculator", {"expression": "1+2"})
    assert calls[1] == ToolCall("python", {"code": "print(1)"})  # arguments as a JSON string, as OpenAI sends
    assert calls[2].name is None and "not valid JSON" in calls[2].problem
    assert calls[3].name is None and "JSON object" in calls[3].problem
    assert calls[4].name == "calculator" and "arguments must be a JSON object" in calls[4].problem
    assert calls[5].name is None and "no closing </tool_call>" in calls[5].problem
    assert len(calls) == text.count("<tool_call>") == 6
    assert parse_tool_calls("the answer is 7") == []


def test_toolbox_answers_bad_calls_with_text(tmp_path):
    tools = load_tools(_write(tmp_path / "tools.yaml", TOOLS_YAML))
    assert tools.call(ToolCall("calculator", {"expression": "2*21"})).text == "42"
    unknown = tools.call(ToolCall("search", {"query": "x"}))
    assert unknown.error == "bad_call" and unknown.text == "error: unknown tool 'search'; available tools: calculator, python"
    broken = tools.call(parse_tool_calls("<tool_call>{oops}</tool_call>")[0])
    assert broken.error == "bad_call" and broken.text.startswith("error: the tool call is not valid JSON")
    assert tools.call(ToolCall("calculator", {"expression": "2**11"})).text == "error: exponent 11 is larger than 10"


def test_tool_metrics_sum_over_experiences():
    infos = [{"tool_calls": {"calculator": 2}, "tool_failures": {"calculator": 1}},
             {"tool_calls": {"calculator": 1, "_invalid": 1}, "tool_failures": {"calculator": 0, "_invalid": 1}},
             {}]
    assert tool_metrics(infos) == {"rollout/tool_calls/_invalid": 1.0, "rollout/tool_calls/calculator": 3.0,
                                   "rollout/tool_failures/_invalid": 1.0, "rollout/tool_failures/calculator": 1.0}
    assert tool_metrics([{}, {"turns": 1}]) == {}


# ---------------------------------------------------------------- the tool config file


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_load_tools_reads_verl_shaped_files(tmp_path):
    tools = load_tools(_write(tmp_path / "tools.yaml", TOOLS_YAML))
    assert list(tools.specs) == ["calculator", "python"]
    assert tools.specs["python"].builtin == "python"  # verl.tools.python_tool.PythonTool -> python
    assert tools.specs["calculator"].schema()["function"]["parameters"]["required"] == ["expression"]
    assert tools.preamble() == (
        "Tools:\n- calculator(expression: string): Evaluate an arithmetic expression.\n"
        "- python(code: string): Run Python code and return what it prints.\n"
        'Call a tool with <tool_call>{"name": ..., "arguments": {...}}</tool_call>.')
    as_json = tmp_path / "tools.json"
    as_json.write_text('{"tools": [{"class_name": "verl.tools.calculator_tool.CalculatorTool", '
                       '"tool_schema": {"type": "function", "function": {"name": "calc"}}}]}')
    calc = load_tools(as_json)
    assert calc.specs["calc"].builtin == "calculator"
    assert calc.specs["calc"].description == "Evaluate an arithmetic expression."  # the built-in's default


def _entry(class_name="calculator", name="calculator", props="{expression: {type: string}}", config="{}"):
    return (f"  - class_name: {class_name}\n    config: {config}\n    tool_schema:\n      type: function\n"
            f"      function:\n        name: {name}\n        parameters: {{type: object, properties: {props}}}\n")


@pytest.mark.parametrize("text, says", [
    ("tools: [\n", "is not valid YAML"),
    ("tools: []\n", "non-empty list 'tools'"),
    ("- calculator\n", "non-empty list 'tools'"),
    ("tools:\n" + _entry(class_name="verl.tools.search_tool.SearchTool"),
     "class_name 'verl.tools.search_tool.SearchTool' names no built-in tool"),
    ("tools:\n" + _entry(class_name="verl.tools.sandbox_fusion_tools.SandboxFusionTool"), "use python)"),
    ("tools:\n" + _entry(name="null"), "tool_schema.function.name must be"),
    ("tools:\n" + _entry(name="'has space'"), "tool_schema.function.name must be"),
    ("tools:\n" + _entry() + _entry(class_name="CalculatorTool"), "is named 'calculator' like an earlier tool"),
    ("tools:\n" + _entry(props="{expr: {type: string}}"), "must declare 'expression'"),
    ("tools:\n" + _entry(config="{timeout_s: 3}"), "unknown config key(s) timeout_s"),
    ("tools:\n" + _entry(config="{max_exponent: -1}"), "config.max_exponent must be a positive int"),
    ("tools:\n" + _entry(config="{type: mcp}"), "config.type 'mcp' is not supported"),
    ("tools:\n" + _entry("python", "python", "{code: {type: string}}", "{sandbox: none}"),
     "config.sandbox must be one of bwrap, guard, got 'none'"),
    ("tools:\n" + _entry("python", "python", "{code: {type: string}}", "{bwrap_path: 3}"),
     "config.bwrap_path must be non-empty text, got 3"),
    ("tools:\n  - class_name: calculator\n    tool_schema: {type: function}\n", "needs tool_schema"),
    ("tools:\n  - class_name: calculator\n    schema: {}\n", "unknown key(s) schema"),
])
def test_bad_tool_configs_say_what_is_wrong(tmp_path, text, says):
    path = _write(tmp_path / "tools.yaml", text)
    with pytest.raises(UserError) as e:
        load_tools(path)
    assert says in str(e.value) and str(path) in str(e.value)


def test_every_declared_builtin_has_its_implementation():
    """The tool config file is checked against ``BUILTIN_TOOLS`` (config.tools); ``TOOLS`` runs the same tools."""
    assert TOOLS.names() == tuple(sorted(BUILTIN_TOOLS))
    for name, declared in BUILTIN_TOOLS.items():
        cls = TOOLS.get(name)
        assert (cls.argument, cls.Config, cls.__name__) == (declared.argument, declared.settings, declared.class_name)


def test_missing_and_bad_json_tool_configs(tmp_path):
    with pytest.raises(UserError, match="does not exist; set explorer.tool_config_path"):
        load_tools(tmp_path / "nope.yaml")
    with pytest.raises(UserError, match=r"is not valid JSON: .* line 1"):
        load_tools(_write(tmp_path / "tools.json", '{"tools": [}'))


# ---------------------------------------------------------------- the workflow


class ScriptedEngine:
    """A stand-in for the model's TEXT only: answers turn t of every episode with ``turns[t]`` (then EOS),
    tokenised with the real tokenizer, with made-up log-probs of -0.5 per token. The turn is read from the
    context: every model turn ends with EOS and the prompt has none, so the EOS count is the turns so far.
    It lets the tool path run deterministically, which the untrained tiny model would almost never take."""

    def __init__(self, tokenizer, turns: list[str]) -> None:
        self.tok, self.turns = tokenizer, turns

    async def generate(self, prompts, sampling, seeds):
        out = []
        for prompt in prompts:
            turn = list(prompt).count(self.tok.eos_token_id)
            ids = self.tok.encode(self.turns[turn], add_special_tokens=False) + [self.tok.eos_token_id]
            out.append(Sample(response_ids=np.asarray(ids, np.int32), logprobs=np.full(len(ids), -0.5, np.float32),
                              finish_reason="stop", model_version=3, engine_id="scripted"))
        return out

    generate_spread = generate  # what single_turn's batched path calls on a fleet


class LocalEngine:
    """The real HFEngine behind the async ``generate`` the workflows call (what the fleet offers)."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine = engine

    async def generate(self, prompts, sampling, seeds):
        return await asyncio.to_thread(self.engine.generate, prompts, sampling, seeds)


def _ctx(tok, tools_path, max_turns=4, repeat=2, max_new_tokens=8):
    return WorkflowContext(sampling=SamplingConfig(temperature=1.0, max_new_tokens=max_new_tokens),
                           repeat_times=repeat, seeds=list(range(7, 7 + repeat)), tokenizer=tok,
                           reward_manager=load_reward_manager(RewardConfig(), tok), max_turns=max_turns,
                           tool_config_path=str(tools_path) if tools_path else "")


_RESPONSES = re.compile(r"(\n<tool_response>.*?</tool_response>)+\n", re.DOTALL)


def _runs(e):
    """(is_model, ids) runs of equal action_mask."""
    mask, runs, start = e.action_mask, [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((bool(mask[start]), e.response_ids[start:i]))
            start = i
    return runs


def _check_invariants(e, tok):
    """The mask is true exactly on model tokens and false exactly on tool responses (log-prob 0), model and
    tool runs alternate starting with the model, and the tool counts match the <tool_call> blocks written."""
    assert len(e.action_mask) == len(e.response_ids) == len(e.logprobs)
    runs = _runs(e)
    assert [is_model for is_model, _ in runs] == [i % 2 == 0 for i in range(len(runs))]
    model_text = ""
    for is_model, ids in runs:
        text = tok.decode(ids.tolist(), skip_special_tokens=True)
        if is_model:
            model_text += text
        else:
            assert _RESPONSES.fullmatch(text), text  # nothing but tool responses is masked
    assert np.all(e.logprobs[~e.action_mask] == 0.0) and np.all(e.logprobs[e.action_mask] < 0.0)
    assert sum(e.info["tool_calls"].values()) == model_text.count("<tool_call>")
    assert len([r for r in runs if r[0]]) == e.info["turns"]


def test_scripted_episode_runs_tools_and_masks_their_output(tmp_path, tiny_model_path):
    tok = hf_tokenizer(tiny_model_path)
    tools = _write(tmp_path / "tools.yaml", TOOLS_YAML)
    script = [
        'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>',
        '<tool_call>{"name": "python", "arguments": {"code": "print(84 + 1)"}}</tool_call> '
        '<tool_call>{oops}</tool_call><tool_call>{"name": "search", "arguments": {}}</tool_call>',
        "85",
    ]
    workflow = load_workflow("tool_agent")
    exps = asyncio.run(workflow.run(Task("t1", "12*7+1=", "85", data_source="arithmetic"),
                                    ScriptedEngine(tok, script), _ctx(tok, tools)))
    assert len(exps) == 2  # repeat_times episodes, one experience each
    expected_tool_text = [
        "\n<tool_response>84</tool_response>\n<tool_response>error: division by zero</tool_response>\n",
        "\n<tool_response>85</tool_response>"
        "\n<tool_response>error: the tool call is not valid JSON (Expecting property name enclosed in double "
        "quotes at character 1)</tool_response>"
        "\n<tool_response>error: unknown tool 'search'; available tools: calculator, python</tool_response>\n",
    ]
    for e in exps:
        _check_invariants(e, tok)
        runs = _runs(e)
        assert [tok.decode(ids.tolist(), skip_special_tokens=True) for m, ids in runs if m] == script
        assert [tok.decode(ids.tolist()) for m, ids in runs if not m] == expected_tool_text
        assert e.info["turns"] == 3
        assert e.info["tool_calls"] == {"calculator": 2, "python": 1, "_invalid": 2}
        assert e.info["tool_failures"] == {"calculator": 1, "python": 0, "_invalid": 2}
        assert e.reward == 1.0  # the final answer "85" (after the last tool response) is the task's answer
        assert e.model_version == 3 and not e.truncated
        assert e.prompt_text == episode_prompt("12*7+1=", load_tools(tools))
        assert list(e.prompt_ids) == tok.encode(e.prompt_text)
    assert workflow.toolbox(_ctx(tok, tools)) is workflow._tools  # loaded once per workflow instance


def test_evaluation_runs_the_tool_workflow_so_tool_use_is_measured(tmp_path, tiny_model_path):
    tok = hf_tokenizer(tiny_model_path)
    tools = _write(tmp_path / "tools.yaml", TOOLS_YAML)
    script = ['<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>', "84"]
    tasks = [Task("e1", "12*7=", "84", data_source="arithmetic"), Task("e2", "12*7=", "85", data_source="arithmetic")]
    ev = EvalTasksetConfig(name="calc", k=2, temperature=1.0)
    with_tools = asyncio.run(evaluate(ScriptedEngine(tok, script), _ctx(tok, tools), "calc", tasks, ev,
                                      workflow=load_workflow("tool_agent")))
    # the answer after the tool response is right for e1 (both samples), wrong for e2 (format reward 0.1)
    assert with_tools == {"eval/calc/accuracy/mean@2": 0.5, "eval/calc/accuracy/best@2": 0.5,
                          "eval/calc/reward_mean": pytest.approx((1.0 + 1.0 + 0.1 + 0.1) / 4)}
    # single-turn evaluation reads the first turn (the tool call) as the answer: no credit
    single = asyncio.run(evaluate(ScriptedEngine(tok, script), _ctx(tok, tools), "calc", tasks, ev))
    assert single["eval/calc/accuracy/mean@2"] == 0.0 and single["eval/calc/reward_mean"] == 0.0


class TemperatureScript(ScriptedEngine):
    """ScriptedEngine whose greedy (temperature 0) episodes answer the last turn with ``greedy_answer``."""

    def __init__(self, tokenizer, turns, greedy_answer):
        super().__init__(tokenizer, turns)
        self.greedy_turns = turns[:-1] + [greedy_answer]

    async def generate(self, prompts, sampling, seeds):
        if sampling.temperature == 0.0:
            return await ScriptedEngine(self.tok, self.greedy_turns).generate(prompts, sampling, seeds)
        return await super().generate(prompts, sampling, seeds)


def test_remax_baseline_is_the_reward_of_a_greedy_tool_episode(tmp_path, tiny_model_path):
    tok = hf_tokenizer(tiny_model_path)
    tools = _write(tmp_path / "tools.yaml", TOOLS_YAML)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>'
    engine = TemperatureScript(tok, [call, "84"], greedy_answer="83")  # the greedy episode answers wrong
    ctx = _ctx(tok, tools)
    ctx.greedy_baseline = True
    exps = asyncio.run(load_workflow("tool_agent").run(Task("b", "12*7=", "84", data_source="arithmetic"), engine, ctx))
    assert len(exps) == 2 and [e.reward for e in exps] == [1.0, 1.0]  # the greedy episode is not an experience
    assert [e.info["reward_baseline"] for e in exps] == [0.1, 0.1]  # a wrong number: the format reward
    assert all(e.info["tool_calls"] == {"calculator": 1} for e in exps)


def test_scripted_episode_out_of_turns_has_no_final_answer(tmp_path, tiny_model_path):
    tok = hf_tokenizer(tiny_model_path)
    tools = _write(tmp_path / "tools.yaml", TOOLS_YAML)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
    exps = asyncio.run(ToolAgentWorkflow().run(Task("t2", "1+1=", "2", data_source="arithmetic"),
                                               ScriptedEngine(tok, [call] * 2), _ctx(tok, tools, max_turns=2, repeat=1)))
    (e,) = exps
    _check_invariants(e, tok)
    assert e.info["turns"] == 2 and e.info["tool_calls"] == {"calculator": 2}
    assert not e.action_mask[-1]  # the last call was answered too, and then the turns ran out
    assert e.reward == 0.0  # no text after the last tool response: no answer


def test_no_tools_configured_every_call_is_invalid(tiny_model_path):
    tok = hf_tokenizer(tiny_model_path)
    ctx = _ctx(tok, "", max_turns=2, repeat=1)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
    (e,) = asyncio.run(ToolAgentWorkflow().run(Task("t3", "1+1=", "2", data_source="arithmetic"),
                                               ScriptedEngine(tok, [call, "2"]), ctx))
    assert e.prompt_text == "1+1="  # no tools: no preamble
    assert e.info["tool_calls"] == {"_invalid": 1} and e.reward == 1.0
    assert "available tools: none are configured" in e.response_text


def test_real_tiny_model_episode_without_tool_calls(tmp_path, tiny_model_path):
    tok = hf_tokenizer(tiny_model_path)
    tools = _write(tmp_path / "tools.yaml", TOOLS_YAML)
    engine = LocalEngine(HFEngine(tiny_model_path, device="cpu"))
    ctx = _ctx(tok, tools, max_turns=3, repeat=4, max_new_tokens=12)
    exps = asyncio.run(ToolAgentWorkflow().run(Task("t4", "3+4=", "7", data_source="arithmetic"), engine, ctx))
    assert len(exps) == 4
    for e in exps:
        _check_invariants(e, tok)
        # the untrained model writes no <tool_call> (these seeds): one turn, every token its own
        assert e.info["turns"] == 1 and e.info["tool_calls"] == {} and bool(e.action_mask.all())
        assert e.reward in (0.0, 0.1, 1.0) and e.model_version == 0
        assert e.prompt_text.startswith("Tools:\n- calculator(expression: string)") and e.prompt_text.endswith("\n3+4=")


def test_a_bad_tool_config_is_refused_at_config_load(tmp_path):
    from trinity_like.config import ConfigError, load_config

    bad = tmp_path / "tools.yaml"
    bad.write_text("tools: []\n")
    with pytest.raises(ConfigError, match="explorer.tool_config_path: tool config .* non-empty list 'tools'"):
        load_config(None, [f"explorer.tool_config_path={bad}", "explorer.workflow=tool_agent"])
