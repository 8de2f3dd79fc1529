"""The coordinator's OpenAI-compatible API, called with the official `openai` Python package.

Runs against a server running the tiny test models (see run.sh), so texts are gibberish but deterministic:
the tests check the API's behaviour, never the quality of the text.
"""

import os

import openai
import pytest

BASE_URL = os.environ["EASD_OPENAI_BASE_URL"]
API_KEY = os.environ.get("EASD_OPENAI_API_KEY", "unused")


@pytest.fixture(scope="session")
def client():
    # No retries: a failure must show up as the error it is.
    return openai.OpenAI(base_url=BASE_URL, api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def model(client):
    return client.models.list().data[0].id


def ask(client, model, **kwargs):
    args = dict(model=model, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=24, temperature=0)
    args.update(kwargs)
    return client.chat.completions.create(**args)


def test_models_lists_the_target_model(client):
    models = client.models.list().data
    assert len(models) == 1
    assert models[0].id == "tiny-qwen2"
    assert client.models.retrieve(models[0].id).id == models[0].id


def test_a_chat_completion_has_text_usage_and_the_easd_summary(client, model):
    r = ask(client, model)
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    summary = r.model_extra["easd"]
    assert summary["mode"] == "sd"
    assert summary["drafted_tokens"] > 0
    assert 0.0 <= summary["acceptance_rate"] <= 1.0


def test_a_streamed_chat_equals_the_non_streamed_one(client, model):
    whole = ask(client, model)
    chunks = list(ask(client, model, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finished == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_completions_streamed_and_not_agree(client, model):
    r = client.completions.create(model=model, prompt="Once upon a time", temperature=0)
    assert r.object == "text_completion"
    assert r.usage.completion_tokens <= 16  # OpenAI's default max_tokens for completions
    streamed = client.completions.create(model=model, prompt="Once upon a time", temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == r.choices[0].text


def test_the_same_seed_gives_the_same_sampled_text_and_another_seed_another(client, model):
    a = ask(client, model, temperature=1.0, seed=42, max_tokens=30)
    b = ask(client, model, temperature=1.0, seed=42, max_tokens=30)
    c = ask(client, model, temperature=1.0, seed=43, max_tokens=30)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.model_extra["easd"]["seed"] == 42
    assert c.choices[0].message.content != a.choices[0].message.content


def test_chat_logprobs_list_each_token_with_its_alternatives(client, model):
    r = ask(client, model, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert t.logprob <= 0.0
        assert isinstance(t.bytes, list)
        assert len(t.top_logprobs) == 3
        # Greedy: the chosen token is the target's most likely one.
        assert t.top_logprobs[0].token == t.token
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob


def test_completions_logprobs_use_the_legacy_format(client, model):
    r = client.completions.create(model=model, prompt="abc", temperature=0, max_tokens=8, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert all(len(alternatives) <= 2 for alternatives in lp.top_logprobs)
    assert all(x <= 0.0 for x in lp.token_logprobs)


def test_a_stop_string_ends_the_text_right_before_it(client, model):
    full = client.completions.create(model=model, prompt="abc", temperature=0, max_tokens=30).choices[0].text
    assert len(full) > 8, full
    stop = full[4:7]
    cut = client.completions.create(model=model, prompt="abc", temperature=0, max_tokens=30, stop=[stop]).choices[0]
    assert cut.text == full[: full.index(stop)]
    assert cut.finish_reason == "stop"


def test_an_invalid_temperature_is_a_400_naming_the_field(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, model, temperature=3)
    assert e.value.status_code == 400
    assert "temperature" in e.value.message
    assert e.value.param == "temperature"


def test_a_prompt_longer_than_the_context_is_context_length_exceeded(client, model):
    # The tiny models' context window is 512 tokens.
    long = " ".join(str(i) for i in range(400))
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, model, messages=[{"role": "user", "content": long}])
    assert e.value.status_code == 400
    assert e.value.code == "context_length_exceeded"
    assert e.value.param == "messages"
    assert e.value.body["type"] == "invalid_request_error"
    assert "max_tokens is 24" in e.value.message and "context length of 512 tokens" in e.value.message


def test_more_than_one_choice_is_refused_clearly(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, model, n=2)
    assert e.value.param == "n"
    assert "n = 1" in e.value.message


def test_the_easd_field_changes_the_mode(client, model):
    sd = ask(client, model)
    always = {"mode": "easd", "tau_draft": 0, "tau_target": 0, "rho": 0}
    easd = ask(client, model, extra_body={"easd": always})
    summary = easd.model_extra["easd"]
    assert summary["mode"] == "easd"
    assert summary["easd_triggers"] > 0
    assert summary["easd_triggers"] == len(summary["triggers"])
    assert easd.choices[0].message.content != sd.choices[0].message.content
    target = ask(client, model, extra_body={"easd": {"mode": "target"}})
    assert target.model_extra["easd"]["mode"] == "target"
    assert target.model_extra["easd"]["drafted_tokens"] == 0
    # Greedy speculative decoding is lossless: the target alone writes the same text.
    assert target.choices[0].message.content == sd.choices[0].message.content


def test_an_unknown_easd_setting_is_a_400_naming_it(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, model, extra_body={"easd": {"mode": "turbo"}})
    assert e.value.param == "easd.mode"


@pytest.mark.skipif(API_KEY == "unused", reason="the server runs without a token")
def test_a_wrong_api_key_is_a_401():
    wrong = openai.OpenAI(base_url=BASE_URL, api_key="wrong-" + API_KEY, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.models.list()
    assert e.value.status_code == 401
