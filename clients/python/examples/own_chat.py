"""An app that keeps its own chat pipeline and uses the engine's memory, end to end on the local stack.

    make run                                                   # in one terminal
    EROS_TOKEN=$(.venv/bin/eros token app-demo) .venv/bin/python clients/python/examples/own_chat.py

The app's "model" is a stand-in function here (put your OpenAI-compatible call in its place: the README's example).
The script appends a first conversation the app had, asks the local stack to dream now (the local stack's sweep;
in AWS the schedule does it), then, in a new session, asks for the context of a new message and shows what the
engine recalled and the prompt section it would put in front of the model, answers with the stand-in and appends
the reply.
"""

from __future__ import annotations

import os

import httpx

from eros_client import Client

URL = os.environ.get("EROS_URL", "http://127.0.0.1:3000")


def stand_in_model(system: str, text: str) -> str:
    """The app's own model call (a stand-in: it says how much it was reminded of)."""
    remembered = system.count("\n- ")
    return f"(stand-in reply to {text!r}, reminded of {remembered} memories)"


def main() -> int:
    eros = Client(URL, token=os.environ["EROS_TOKEN"])
    first = eros.create_session("luna").id
    said = eros.append_messages(first, [
        {"role": "user", "content": "I just moved to Lisbon and I'm learning Portuguese"},
        {"role": "assistant", "content": "Parabéns! How is the learning going?"},
        {"role": "user", "content": "Slowly. My cat Miso hates the new flat"},
        {"role": "assistant", "content": "Poor Miso, cats need time."}])
    print(f"appended {len(said.messages)} messages ({said.utterances} utterances) to session {first}")
    swept = httpx.post(f"{URL}/local/sweep", json={"idle_now": True}, timeout=120,
                       headers={"Authorization": f"Bearer {os.environ['EROS_TOKEN']}"}).json()
    print(f"local sweep: claimed {swept['claimed']} session(s): "
          + "; ".join(f"{j['outcome']} ({j.get('memories', 0)} memories, episode {j.get('episode')})"
                      for j in swept["jobs"]))
    later = eros.create_session("luna").id
    message = "Any tips for settling in with my cat?"
    context = eros.get_context(later, message, store=True)
    print(f"context for {message!r}: {len(context.memories)} memories")
    for memory in context.memories:
        print(f"  [{memory.layer}/{memory.category or '-'}] {memory.content}  (score {memory.score:.3f})")
    system = "You are Luna, a warm friend." + ("\n\n" + context.prompt if context.prompt else "")
    reply = stand_in_model(system, message)
    eros.append_messages(later, [{"role": "assistant", "content": reply,
                                  "client_message_id": context.message.client_message_id}])
    print(f"reply appended: {reply}")
    print(f"the prompt section the model got:\n{context.prompt}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
