"""Chat templates: Hugging Face rendering semantics, the built-in families, prefix stability
of routing keys across turns, template sources and the registry's precedence."""

from __future__ import annotations

import json
from datetime import date, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from proxy.prompt import (
    BUILTINS,
    ChatTemplate,
    PromptConfig,
    PromptError,
    TemplateRaised,
    TemplateRegistry,
    TemplateRenderError,
    TemplateSource,
    builtin_name_for,
    load_tokenizer_config,
    routing_text,
)
from proxy.prompt.messages import messages as canonical_messages

ENGINES = Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "engines"
DAY = date(2025, 3, 4)

SYSTEM = {"role": "system", "content": "You are a careful coding agent. Use the tools."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file from the repository",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "Relative path"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "Run the test suite",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str, reasoning: str | None = None) -> dict[str, Any]:
    message = {"role": "assistant", "content": text}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def call(call_id: str, name: str, arguments: dict[str, Any], reasoning: str | None = None):
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def chat_turns(system: bool = True) -> list[list[dict[str, Any]]]:
    """Each request of a plain multi-turn chat: the previous one + the reply + a new question."""
    turns = [[SYSTEM, user("What is a prefix cache?")] if system else [user("Hello there")]]
    for i, reply in enumerate(["It keeps KV state of seen prompts.", "Yes, per block.", "Done."]):
        turns.append([*turns[-1], assistant(reply), user(f"Follow-up question {i}?")])
    return turns


def agent_turns(
    ids: list[str], reasoning: bool = False, system: bool = True
) -> list[list[dict[str, Any]]]:
    """Each request of a tool-using agent: tool calls and results, then a new user message."""
    think = "I should look at the code first." if reasoning else None
    first = [SYSTEM] if system else []
    first.append(user("Fix the failing test in main.py"))
    turns = [first]
    turns.append(
        [
            *turns[-1],
            call(ids[0], "read_file", {"path": "main.py"}, think),
            result(ids[0], "print('hi')"),
        ]
    )
    turns.append(
        [*turns[-1], call(ids[1], "run_tests", {}, think), result(ids[1], "1 failed, 3 passed")]
    )
    turns.append(
        [
            *turns[-1],
            assistant("Fixed: the assertion was wrong."),
            user("Now add a test for util.py"),
        ]
    )
    turns.append(
        [*turns[-1], call(ids[2], "read_file", {"path": "util.py"}), result(ids[2], "def f(): ...")]
    )
    return turns


def keys(registry: TemplateRegistry, model: str, turns, tools=None) -> list[str]:
    body_tools = {"tools": tools} if tools else {}
    return [
        routing_text("chat", {"model": model, "messages": turn, **body_tools}, registry, DAY)
        for turn in turns
    ]


def common_prefix(a: str, b: str) -> int:
    """How many leading characters two keys share."""
    pairs = enumerate(zip(a, b, strict=False))
    return next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))


@pytest.fixture
def registry() -> TemplateRegistry:
    return TemplateRegistry(PromptConfig())


MODELS = {
    "chatml": "my-chatml-model",
    "qwen2_5": "Qwen/Qwen2.5-7B-Instruct",
    "qwen3": "Qwen/Qwen3-8B",
    "llama3": "meta-llama/Llama-3.1-8B-Instruct",
    "llama3_2": "meta-llama/Llama-3.2-3B-Instruct",
    "mistral_nemo": "mistralai/Mistral-Nemo-Instruct-2407",
    "mistral_small_3": "mistralai/Mistral-Small-3.2-24B-Instruct-2506",
    "gemma": "google/gemma-3-4b-it",
    "fallback": "some-unknown-model",
}


def test_every_builtin_has_a_model_name_here() -> None:
    assert {b.name for b in BUILTINS} | {"fallback"} == set(MODELS)


@pytest.mark.parametrize(("name", "model"), MODELS.items())
def test_model_names_choose_their_family(registry: TemplateRegistry, name: str, model: str):
    assert registry.template_for(model).name == name


def test_pattern_order_picks_the_specific_family_first() -> None:
    assert builtin_name_for("qwen3-coder-30b") == "qwen3"
    assert builtin_name_for("QwQ-32B") == "qwen2_5"
    assert builtin_name_for("llama3.2:3b") == "llama3_2"
    assert builtin_name_for("Llama-3.3-70B-Instruct") == "llama3"
    assert builtin_name_for("Mixtral-8x7B-Instruct") == "mistral_nemo"
    assert builtin_name_for("Devstral-Small-2507") == "mistral_small_3"
    assert builtin_name_for("gpt-4o") is None


# --- what each family renders (formats as the model cards document them) ---------------

TWO_TURNS = [SYSTEM, user("Hi"), assistant("Hello!"), user("Bye")]
S = SYSTEM["content"]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "chatml",
            f"<|im_start|>system\n{S}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n",
        ),
        (
            "qwen3",
            f"<|im_start|>system\n{S}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n",
        ),
        (
            "llama3",
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            f"Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n{S}<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>",
        ),
        (
            "llama3_2",
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            f"Cutting Knowledge Date: December 2023\nToday Date: 04 Mar 2025\n\n{S}<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>",
        ),
        ("mistral_nemo", f"<s>[INST]Hi[/INST]Hello!</s>[INST]{S}\n\nBye[/INST]"),
        (
            "mistral_small_3",
            f"<s>[SYSTEM_PROMPT]{S}[/SYSTEM_PROMPT][INST]Hi[/INST]Hello!</s>[INST]Bye[/INST]",
        ),
        (
            "gemma",
            f"<bos><start_of_turn>user\n{S}\n\nHi<end_of_turn>\n"
            "<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n",
        ),
        ("fallback", f"<|system|>\n{S}\n<|user|>\nHi\n<|assistant|>\nHello!\n<|user|>\nBye\n"),
    ],
)
def test_family_renders_the_documented_format(
    registry: TemplateRegistry, name: str, expected: str
) -> None:
    text = routing_text("chat", {"model": MODELS[name], "messages": TWO_TURNS}, registry, DAY)
    assert text == expected


def test_qwen2_5_adds_its_default_system_prompt_and_tools(registry: TemplateRegistry) -> None:
    template = registry.template_for(MODELS["qwen2_5"])
    plain = template.render([user("Hi")])
    assert plain.startswith(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    )
    with_tools = template.render([SYSTEM, user("Hi")], tools=TOOLS)
    assert "# Tools" in with_tools
    assert json.dumps(TOOLS[0], ensure_ascii=False) in with_tools


def test_mistral_small_default_system_prompt_carries_the_date(registry: TemplateRegistry):
    text = registry.template_for(MODELS["mistral_small_3"]).render([user("Hi")], today=DAY)
    assert "The current date is 2025-03-04." in text


# --- prefix stability: turn N's key is a prefix of turn N+1's ----------------------------


@pytest.mark.parametrize("name", MODELS)
def test_plain_multi_turn_keys_extend_each_other(registry: TemplateRegistry, name: str):
    """Every family but Mistral Nemo (which moves the system prompt) without a system prompt."""
    for system in (True, False):
        if name == "mistral_nemo" and system:
            continue
        ks = keys(registry, MODELS[name], chat_turns(system))
        for before, after in pairwise(ks):
            assert after.startswith(before), (name, system)
            assert len(after) > len(before)


@pytest.mark.parametrize("name", ["chatml", "qwen2_5", "qwen3", "llama3", "llama3_2", "fallback"])
def test_agent_keys_extend_each_other_with_tools(registry: TemplateRegistry, name: str):
    ks = keys(registry, MODELS[name], agent_turns(["call_1", "call_2", "call_3"]), TOOLS)
    for before, after in pairwise(ks):
        assert after.startswith(before), name
    assert registry.template_errors == {}


def test_agent_tool_calls_and_results_are_in_the_key(registry: TemplateRegistry) -> None:
    ks = keys(registry, MODELS["qwen2_5"], agent_turns(["call_1", "call_2", "call_3"]), TOOLS)
    assert '<tool_call>\n{"name": "read_file", "arguments": {"path": "main.py"}}' in ks[1]
    assert "<tool_response>\nprint('hi')\n</tool_response>" in ks[1]
    llama = keys(registry, MODELS["llama3"], agent_turns(["c1", "c2", "c3"]), TOOLS)
    assert '{"name": "read_file", "parameters": {"path": "main.py"}}' in llama[1]
    assert "<|start_header_id|>ipython<|end_header_id|>" in llama[1]


def test_qwen3_reasoning_of_earlier_turns_is_stripped_like_the_engine_does(registry):
    """A final answer's reasoning never enters the key (it is stripped once the user speaks);
    reasoning of tool-call steps is kept during the tool loop and dropped when the user
    speaks again, which is exactly where the engine's own prompt changes too."""
    model = MODELS["qwen3"]
    answer = assistant("<think>\nLet me think.\n</think>\n\nThe answer is 4.")
    turn1 = [SYSTEM, user("2+2?")]
    turn2 = [*turn1, answer, user("And 3+3?")]
    k1, k2 = keys(registry, model, [turn1, turn2])
    assert k2.startswith(k1)
    assert "<think>" not in k2 and "The answer is 4.<|im_end|>" in k2

    ks = keys(registry, model, agent_turns(["c1", "c2", "c3"], reasoning=True), TOOLS)
    assert ks[1].startswith(ks[0]) and ks[2].startswith(ks[1])
    assert "<think>\nI should look at the code first.\n</think>" in ks[2]
    first_think = ks[2].index("<think>")
    assert first_think <= common_prefix(ks[2], ks[3]) < first_think + len("<think>")
    assert "<think>" not in ks[3]
    assert ks[4].startswith(ks[3])


def test_qwen3_generation_prompt_holds_the_empty_think_block(registry: TemplateRegistry):
    template = registry.template_for(MODELS["qwen3"])
    turn = [SYSTEM, user("2+2?")]
    key = template.render(turn)
    prompt = template.render(turn, add_generation_prompt=True, enable_thinking=False)
    assert prompt == key + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    thinking = template.render(turn, add_generation_prompt=True, enable_thinking=True)
    assert thinking == key + "<|im_start|>assistant\n"
    via_request = routing_text(
        "chat",
        {
            "model": MODELS["qwen3"],
            "messages": turn,
            "chat_template_kwargs": {"enable_thinking": False},
        },
        registry,
        DAY,
    )
    assert via_request == key


@pytest.mark.parametrize("name", ["mistral_nemo", "mistral_small_3"])
def test_mistral_keys_change_where_the_tool_block_moves(registry: TemplateRegistry, name: str):
    """Mistral templates put the tool list before the LAST user message, so a new user turn
    moves it: the key (like the engine's prompt) keeps everything before the old spot.
    Within a tool loop (same last user message) the keys extend each other. (Nemo also puts
    the system prompt into the user message only while that is the conversation's last
    message, so its agents run without one here.)"""
    ids = ["aaaaaaaa1", "aaaaaaaa2", "aaaaaaaa3"]
    turns = agent_turns(ids, system=name != "mistral_nemo")
    ks = keys(registry, MODELS[name], turns, TOOLS)
    assert registry.template_errors == {}
    assert ks[1].startswith(ks[0]) and ks[2].startswith(ks[1]) and ks[4].startswith(ks[3])
    tools_at = ks[2].index("[AVAILABLE_TOOLS]")
    assert tools_at <= common_prefix(ks[2], ks[3]) < tools_at + len("[AVAILABLE_TOOLS]")
    assert ks[3][tools_at:].startswith("[INST]")


def test_gemma_falls_back_on_tool_roles_and_stays_prefix_stable(registry: TemplateRegistry):
    """Gemma's template only knows alternating user/model turns; tool messages make it raise
    (the engine would refuse them too), the failure is counted and the key comes from the
    generic rendering, which stays prefix-stable from then on."""
    ks = keys(registry, MODELS["gemma"], agent_turns(["c1", "c2", "c3"]), TOOLS)
    assert ks[0].startswith("<bos><start_of_turn>user\n")
    assert registry.template_errors["gemma"] == 4
    assert ks[1].startswith("<|tools|>\n")
    for before, after in pairwise(ks[1:]):
        assert after.startswith(before)


def test_llama3_2_date_is_stable_within_a_day(registry: TemplateRegistry) -> None:
    model = MODELS["llama3_2"]
    body = {"model": model, "messages": [SYSTEM, user("What day is it?")]}
    morning = routing_text("chat", body, registry, datetime(2025, 3, 4, 0, 0, 1))
    night = routing_text("chat", body, registry, datetime(2025, 3, 4, 23, 59, 59))
    next_day = routing_text("chat", body, registry, datetime(2025, 3, 5, 0, 0, 1))
    assert morning == night
    assert "Today Date: 04 Mar 2025" in morning
    assert next_day != morning and "Today Date: 05 Mar 2025" in next_day


def test_strftime_now_never_shows_the_time_of_day() -> None:
    template = ChatTemplate("clock", "{{ strftime_now('%Y-%m-%d %H:%M:%S') }}")
    assert template.render([], today=datetime(2025, 3, 4, 17, 45, 12)) == "2025-03-04 00:00:00"


# --- Hugging Face semantics ---------------------------------------------------------------


def test_tojson_keeps_unicode_and_takes_hf_options() -> None:
    template = ChatTemplate(
        "j", "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2, sort_keys=true) }}"
    )
    out = template.render([{"b": "héllo ✓", "a": 1}])
    assert out == '{"b": "héllo ✓", "a": 1}|{\n  "a": 1,\n  "b": "héllo ✓"\n}'


def test_trim_blocks_lstrip_blocks_and_loop_controls() -> None:
    source = (
        "  {% for m in messages %}\n"
        "{% if loop.index > 2 %}{% break %}{% endif %}{{ m }},\n"
        "  {% endfor %}\n"
    )
    assert ChatTemplate("t", source).render(["a", "b", "c"]) == "a,\nb,\n"


def test_generation_tag_renders_its_body() -> None:
    template = ChatTemplate("g", "{% generation %}{{ messages[0] }}{% endgeneration %}!")
    assert template.render(["x"]) == "x!"


def test_raise_exception_is_a_template_error_and_a_render_error() -> None:
    template = ChatTemplate("r", "{{ raise_exception('roles must alternate') }}")
    with pytest.raises(TemplateRenderError, match="roles must alternate") as info:
        template.render([])
    assert isinstance(info.value.__cause__, TemplateRaised)
    assert isinstance(info.value, PromptError)


def test_sandbox_refuses_python_internals_and_mutation() -> None:
    escape = ChatTemplate("x", "{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(TemplateRenderError):
        escape.render([])
    mutate = ChatTemplate("m", "{{ messages.append(1) }}")
    with pytest.raises(TemplateRenderError):
        mutate.render([])


def test_fast_lookups_keep_the_sandbox_rules() -> None:
    """Unsafe lookups fail or print nothing, exactly as in the plain sandbox."""
    plain = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    for source in [
        "{{ messages[0].update({'a': 1}) }}",
        "{{ messages[0].pop('a') }}",
        "{{ '{0.__class__}'.format(messages) }}",
        "{% for m in messages %}{{ loop.__class__.__init__.__globals__ }}{% endfor %}",
        "{% set ns = namespace(a=1) %}{{ ns._Namespace__attrs }}{{ ns.missing }}",
        "{{ messages[0].__class__ }}{{ messages[0].missing }}{{ 'x'.__class__ }}",
    ]:
        try:
            expected = plain.from_string(source).render(messages=[{"a": 1}])
        except jinja2.TemplateError:
            with pytest.raises(TemplateRenderError):
                ChatTemplate("unsafe", source).render([{"a": 1}])
        else:
            assert expected == ""
            assert ChatTemplate("unsafe", source).render([{"a": 1}]) == ""
    shadowed = ChatTemplate("s", "{{ messages[0].items() | list }}|{{ messages[0].a }}")
    assert shadowed.render([{"items": "x", "a": 1}]) == "[('items', 'x'), ('a', 1)]|1"


def _hf_raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _hf_tojson(value: Any, indent: int | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys)


@pytest.mark.parametrize("name", MODELS)
def test_renders_exactly_like_the_plain_hugging_face_sandbox(registry, name: str) -> None:
    """The fast lookups change nothing: same text (or same refusal) as a plain
    ImmutableSandboxedEnvironment set up the way transformers sets it up."""
    hf = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    hf.filters["tojson"] = _hf_tojson
    hf.globals["raise_exception"] = _hf_raise
    ours = registry.template_for(MODELS[name])
    reference = hf.from_string(ours.source)
    ids = ["aaaaaaaa1", "aaaaaaaa2", "aaaaaaaa3"]
    for turn in [*chat_turns(), *agent_turns(ids, reasoning=True)]:
        messages = canonical_messages(turn)
        try:
            expected = reference.render(
                messages=messages,
                tools=TOOLS,
                add_generation_prompt=True,
                bos_token=ours.bos_token,
                eos_token=ours.eos_token,
                strftime_now=DAY.strftime,
            )
        except jinja2.TemplateError:
            with pytest.raises(TemplateRenderError):
                ours.render(messages, TOOLS, True, DAY)
            continue
        assert ours.render(messages, TOOLS, True, DAY) == expected


def test_bad_template_syntax_is_a_prompt_error() -> None:
    with pytest.raises(PromptError, match="does not compile"):
        ChatTemplate("broken", "{% for m in messages %}")


def test_special_tokens_and_extra_kwargs_reach_the_template() -> None:
    template = ChatTemplate("k", "{{ bos_token }}{{ flavor }}{{ eos_token }}", "<s>", "</s>")
    assert template.render([], flavor="x") == "<s>x</s>"


def test_content_parts_are_joined_for_string_templates_only(registry) -> None:
    parts = [{"type": "text", "text": "look"}, {"type": "text", "text": "here"}]
    msgs = [{"role": "user", "content": parts}]
    chatml = registry.template_for(MODELS["chatml"])
    assert not chatml.accepts_content_parts
    assert chatml.render(msgs) == "<|im_start|>user\nlook\nhere<|im_end|>\n"
    gemma = registry.template_for(MODELS["gemma"])
    assert gemma.accepts_content_parts
    assert gemma.render(msgs) == "<bos><start_of_turn>user\nlookhere<end_of_turn>\n"


# --- sources and the registry -------------------------------------------------------------


def test_tokenizer_config_string_template_and_token_forms(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer_config.json"
    config = {
        "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}",
        "bos_token": {"content": "<s>", "lstrip": False},
        "eos_token": "</s>",
    }
    path.write_text(json.dumps(config))
    loaded = load_tokenizer_config(path)
    assert (loaded.bos_token, loaded.eos_token) == ("<s>", "</s>")
    registry = TemplateRegistry(
        PromptConfig(templates={"m": TemplateSource(tokenizer_config=str(path))})
    )
    assert registry.template_for("m").render([user("hi")]) == "<s>hi"


def test_tokenizer_config_list_form_takes_default_and_null_bos(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer_config.json"
    config = {
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "DEFAULT"},
        ],
        "bos_token": None,
        "eos_token": "<|im_end|>",
    }
    path.write_text(json.dumps(config))
    loaded = load_tokenizer_config(path)
    assert (loaded.source, loaded.bos_token, loaded.eos_token) == ("DEFAULT", "", "<|im_end|>")
    config["chat_template"] = [{"name": "tool_use", "template": "TOOLS"}]
    path.write_text(json.dumps(config))
    with pytest.raises(PromptError, match="no 'default'"):
        load_tokenizer_config(path)


def test_tokenizer_config_without_template_uses_the_jinja_file_beside_it(tmp_path: Path):
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(PromptError, match="no chat_template"):
        load_tokenizer_config(path)
    (tmp_path / "chat_template.jinja").write_text("BESIDE")
    assert load_tokenizer_config(path).source == "BESIDE"


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"chat_template": 5}', "string"),
    ],
)
def test_tokenizer_config_garbage_is_a_clear_error(tmp_path: Path, content: str, match: str):
    path = tmp_path / "tokenizer_config.json"
    path.write_text(content)
    with pytest.raises(PromptError, match=match):
        load_tokenizer_config(path)


def test_missing_template_file_and_unknown_builtin_fail_at_startup(tmp_path: Path) -> None:
    missing = TemplateSource(file=str(tmp_path / "nope.jinja"))
    with pytest.raises(PromptError, match="cannot read"):
        TemplateRegistry(PromptConfig(templates={"m": missing}))
    with pytest.raises(PromptError, match="unknown built-in"):
        TemplateRegistry(PromptConfig(templates={"m": TemplateSource(builtin="nope")}))
    with pytest.raises(PromptError, match="exactly one"):
        TemplateSource(file="a", inline="b")


def test_precedence_config_then_backend_then_builtin_then_fallback(tmp_path: Path) -> None:
    template_file = tmp_path / "t.jinja"
    template_file.write_text("FILE")
    registry = TemplateRegistry(
        PromptConfig(
            templates={
                "qwen-configured": TemplateSource(file=str(template_file)),
                "other": TemplateSource(builtin="gemma", bos_token="<B>"),
            }
        )
    )
    registry.set_backend_template("qwen-configured", "BACKEND")
    registry.set_backend_template("qwen-from-backend", "BACKEND {{ bos_token }}", "<s>")
    assert registry.template_for("qwen-configured").render([]) == "FILE"
    assert registry.template_for("qwen-from-backend").render([]) == "BACKEND <s>"
    assert registry.template_for("qwen-plain").name == "qwen2_5"
    assert registry.template_for("other").render([user("x")]).startswith("<B><start_of_turn>")
    assert registry.template_for("nothing-known") is registry.fallback


def test_templates_are_compiled_once_and_backend_updates_replace_them() -> None:
    registry = TemplateRegistry(PromptConfig())
    assert registry.template_for("qwen3") is registry.template_for("qwen3-8b")
    registry.set_backend_template("m", "ONE")
    first = registry.template_for("m")
    registry.set_backend_template("m", "ONE")
    assert registry.template_for("m") is first
    registry.set_backend_template("m", "TWO")
    assert registry.template_for("m").render([]) == "TWO"
    with pytest.raises(PromptError):
        registry.set_backend_template("m", "{% if %}")
    assert registry.template_for("m").render([]) == "TWO"


@pytest.mark.skipif(not ENGINES.is_dir(), reason="shared/fixtures not present")
def test_llama_cpp_props_template_renders_like_chatml() -> None:
    raw = (ENGINES / "llama-server-lcp0.3.36" / "props.json").read_text()
    props = json.loads(raw[: raw.rindex("}") + 1])
    registry = TemplateRegistry(PromptConfig())
    registry.set_backend_template(
        "tiny-llama", props["chat_template"], props["bos_token"], props["eos_token"]
    )
    body = {"model": "tiny-llama", "messages": TWO_TURNS}
    assert routing_text("chat", body, registry) == routing_text(
        "chat", {**body, "model": MODELS["chatml"]}, registry
    )
