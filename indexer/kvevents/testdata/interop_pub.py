#!/usr/bin/python3
"""A libzmq KV-event publisher for kvgate's interop test (shared/spec/kv-events.md).

It plays a vLLM/SGLang engine: live batches on an XPUB socket (wire-identical
to the engines' PUB for a subscriber; XPUB also shows us the subscription) and
replay on a ROUTER socket. Needs only Debian's python3-zmq and python3-msgpack:

    apt-get install -y python3-zmq python3-msgpack
    /usr/bin/python3 indexer/testdata/interop_pub.py [--reply-style new|old] [--topic T]

At start it prints one JSON line, {"pub": "tcp://127.0.0.1:P", "replay":
"tcp://127.0.0.1:R"}, then reads JSON commands from stdin, one per line, and
answers each with one JSON line:

    {"cmd": "wait_sub"}  -> {"ok": true} once a subscriber gets our topic
    {"cmd": "publish", "encoding": "map"|"array", "drop": false,
     "batch": {"ts": 1.5, "rank": null, "two_element": false, "events": [...]}}
                         -> {"seq": n}
    {"cmd": "quit"}      -> exits 0 (so does end of input)

One thread owns both sockets and stdin, multiplexed with a zmq.Poller, so
replay requests are served while it waits for commands.
"""
import argparse
import collections
import json
import os
import sys

import msgpack
import zmq

END_SEQ = b"\xff" * 8
BUFFER_STEPS = 10000  # vLLM's default replay buffer

# Array-form field order after the type name (kv-events.md, "Events").
ARRAY_FIELDS = {
    "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size",
                    "lora_id", "medium", "lora_name"],
    "BlockRemoved": ["block_hashes", "medium"],
    "AllBlocksCleared": [],
}
# Newer BlockStored fields, appended only when the command carries them.
OPTIONAL_STORED = ["extra_keys", "group_idx"]


def encode_event(ev, encoding):
    typ = ev["type"]
    names = list(ARRAY_FIELDS[typ])
    if typ == "BlockStored":
        # An array carrying group_idx needs the extra_keys slot before it.
        last = max([i for i, n in enumerate(OPTIONAL_STORED) if n in ev], default=-1)
        names += OPTIONAL_STORED[:last + 1]
    if encoding == "map":
        out = {"type": typ}  # dicts keep insertion order: "type" goes first
        for n in names:
            out[n] = ev.get(n)
        return out
    if encoding == "array":
        return [typ] + [ev.get(n) for n in names]
    raise ValueError("unknown encoding %r" % encoding)


def encode_batch(batch, encoding):
    events = [encode_event(ev, encoding) for ev in batch["events"]]
    body = [float(batch["ts"]), events]
    if not batch.get("two_element", False):
        body.append(batch.get("rank"))
    # Python ints >= 2**63 pack as uint64 (0xcf), negative ones as int64.
    return msgpack.packb(body, use_bin_type=True)


class Publisher:
    def __init__(self, reply_style, topic):
        self.new_style = reply_style == "new"
        self.topic = topic.encode()
        self.ctx = zmq.Context()
        self.xpub = self.ctx.socket(zmq.XPUB)
        self.router = self.ctx.socket(zmq.ROUTER)
        for s in (self.xpub, self.router):
            s.setsockopt(zmq.LINGER, 0)
        self.pub_port = self.xpub.bind_to_random_port("tcp://127.0.0.1")
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.next_seq = 0
        self.buffer = collections.deque(maxlen=BUFFER_STEPS)  # (seq, payload)
        self.subscriptions = set()  # topic prefixes subscribed to

    def close(self):
        self.xpub.close(linger=0)
        self.router.close(linger=0)
        self.ctx.term()

    def read_subscriptions(self):
        while True:
            try:
                msg = self.xpub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            # 1 = subscribe, 0 = the last subscriber of a prefix left.
            if msg[:1] == b"\x01":
                self.subscriptions.add(msg[1:])
            elif msg[:1] == b"\x00":
                self.subscriptions.discard(msg[1:])

    def subscribed(self):
        """Whether some subscriber gets our topic."""
        return any(self.topic.startswith(t) for t in self.subscriptions)

    def publish(self, cmd):
        payload = encode_batch(cmd["batch"], cmd.get("encoding", "map"))
        seq = self.next_seq
        self.next_seq += 1
        self.buffer.append((seq, payload))
        if not cmd.get("drop", False):
            self.xpub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def serve_replay(self):
        while True:
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            # [identity, "", start seq]; anything else is ignored, as vLLM does.
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                continue
            ident, start = frames[0], int.from_bytes(frames[2], "big")
            for seq, payload in list(self.buffer):
                if seq >= start:
                    self.reply(ident, seq.to_bytes(8, "big"), payload, self.topic)
            self.reply(ident, END_SEQ, b"", b"")

    def reply(self, ident, seq, payload, topic):
        if self.new_style:
            self.router.send_multipart([ident, b"", topic, seq, payload])
        else:
            self.router.send_multipart([ident, b"", seq, payload])


def answer(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reply-style", choices=("new", "old"), default="new")
    ap.add_argument("--topic", default="")
    args = ap.parse_args()

    p = Publisher(args.reply_style, args.topic)
    answer({"pub": "tcp://127.0.0.1:%d" % p.pub_port,
            "replay": "tcp://127.0.0.1:%d" % p.replay_port})

    stdin = sys.stdin.fileno()
    poller = zmq.Poller()
    poller.register(p.xpub, zmq.POLLIN)
    poller.register(p.router, zmq.POLLIN)
    poller.register(stdin, zmq.POLLIN)
    partial = b""                   # stdin bytes not yet ending in a newline
    queue = collections.deque()     # complete command lines not yet run
    waiting_sub = False             # a wait_sub is unanswered
    eof = False
    try:
        while True:
            ready = dict(poller.poll())
            if p.xpub in ready:
                p.read_subscriptions()
            if p.router in ready:
                p.serve_replay()
            if stdin in ready:
                # Read raw bytes: a buffered readline could hold a second
                # command that poll would then never report.
                chunk = os.read(stdin, 65536)
                if not chunk:
                    eof = True
                    poller.unregister(stdin)
                *lines, partial = (partial + chunk).split(b"\n")
                queue.extend(l for l in lines if l.strip())
            if waiting_sub and p.subscribed():
                waiting_sub = False
                answer({"ok": True})
            # Commands run in order; a pending wait_sub holds back the rest.
            while queue and not waiting_sub:
                cmd = json.loads(queue.popleft())
                name = cmd.get("cmd")
                if name == "quit":
                    return 0
                if name == "wait_sub":
                    p.read_subscriptions()
                    if p.subscribed():
                        answer({"ok": True})
                    else:
                        waiting_sub = True
                elif name == "publish":
                    try:
                        answer({"seq": p.publish(cmd)})
                    except (KeyError, TypeError, ValueError) as e:
                        answer({"error": "bad publish: %r" % e})
                else:
                    answer({"error": "unknown command %r" % name})
            if eof and not queue:
                return 0
    finally:
        p.close()


if __name__ == "__main__":
    sys.exit(main())
