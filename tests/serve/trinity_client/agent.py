"""Trinity-RFT's agent of its serve-mode test, copied unchanged from upstream (see README.md): only the import of
``TrinityClient`` names where the copy lives here."""
import random

from tests.serve.trinity_client.client import TrinityClient


def run_agent(proxy_url, model_path: str, stream: bool):
    proxy_client = TrinityClient(proxy_url=proxy_url)
    openai_client = proxy_client.get_openai_client()
    contents = [
        "Hello, how are you?",
        "What is the capital of China?",
        "Tell me a joke.",
        "Explain the theory of relativity.",
        "What is the meaning of life?",
        "How does a computer work?",
        "What is the weather like today?",
        "Can you recommend a good book?",
        "What is the best way to learn programming?",
        "Describe the process of photosynthesis.",
    ]
    if stream:
        stream_response = openai_client.chat.completions.create(
            model=model_path,
            messages=[{"role": "user", "content": random.choice(contents)}],
            stream=True,
        )
        response_id = None
        text_parts = []
        for chunk in stream_response:
            if response_id is None and getattr(chunk, "id", None):
                response_id = chunk.id
            if not getattr(chunk, "choices", None):
                continue
            delta = chunk.choices[0].delta
            if delta is None:
                continue
            content = getattr(delta, "content", None)
            if content:
                text_parts.append(content)

        if response_id is not None:
            proxy_client.feedback(reward=2.0, msg_ids=[response_id])
        return "".join(text_parts)
    else:
        response = openai_client.chat.completions.create(
            model=model_path,
            messages=[{"role": "user", "content": random.choice(contents)}],
            stream=False,
        )
        proxy_client.feedback(reward=2.0, msg_ids=[response.id])
        return response.choices[0].message.content
