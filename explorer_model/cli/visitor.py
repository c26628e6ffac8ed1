"""One visitor of the app, reduced to Streamlit's websocket protocol: a page run (BackMsg rerun_script with the URL
or one widget's new value) timed until script_finished, the problems the page showed (exceptions, error alerts), the
widgets' ids and ranges it saw, and a download button's click (Streamlit's deferred-file request, then the file).
The prompts the load test's visitors type are made here too, in English and Chinese."""
from __future__ import annotations

import asyncio
import math
import random
import time
from urllib.parse import parse_qs

EN = (["The teacher", "A small robot", "My grandmother", "The old library", "Every student", "The river pilot",
       "A tired engineer", "The city council", "Our neighbour's cat", "The young doctor"],
      ["explained", "painted", "carried", "forgot", "repaired", "described", "counted", "found", "sold", "opened"],
      ["three equations on the board", "a map of the northern islands", "the broken bicycle",
       "a letter from nineteen years ago", "seven baskets of apples", "the secret garden gate",
       "a recipe for bread", "the noisy printer", "two paintings of the sea", "the last train ticket"],
      ["before lunch", "in the rain", "while the bells rang", "after the long meeting", "near the harbour",
       "during the exam", "on a quiet Sunday", "at the edge of town"])
ZH = ["今天老师在黑板上写了三个方程，", "小机器人在雨中修好了自行车，", "图书馆里有一封很旧的信，",
      "我们在公园里数了七篮苹果，", "医生在会议之后打开了花园的门，"]


def make_prompts(visitor: int, count: int, seed: int, chars: int = 0) -> list[str]:
    """`count` different prompts for one visitor, unique across visitors (so every one is a forward pass);
    with `chars`, each is repeated up to that many characters."""
    rng = random.Random(seed * 1000 + visitor)
    out = []
    for i in range(count):
        if rng.random() < 0.2:
            text = "".join(rng.sample(ZH, rng.randint(1, 3))) + f"第{visitor}号学生问了第{i}个问题。"
        else:
            parts = [f"{rng.choice(EN[0])} {rng.choice(EN[1])} {rng.choice(EN[2])} {rng.choice(EN[3])}"
                     for _ in range(rng.randint(1, 3))]
            text = f"Visitor {visitor}, question {i}: " + ", and then ".join(parts) + "."
        out.append((text + " ") * (chars // (len(text) + 1)) + text[:chars % (len(text) + 1)] if chars else text)
    return out


def percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


# --------------------------------------------------------------------------- one visitor
class Visitor:
    """One browser tab, reduced to Streamlit's protocol."""

    def __init__(self, port: int, timeout: float, sticky: bool = False):
        self.url, self.timeout = f"ws://127.0.0.1:{port}/_stcore/stream", timeout
        self.ws, self.ids, self.query, self.view_labels, self.limits = None, {}, {}, [], {}
        self.downloads: dict[str, str] = {}  # a download button's key -> its deferred file id
        self.session_id = ""
        self.sticky, self.backend = sticky, None

    async def connect(self) -> None:
        import websockets

        headers = {}
        if self.sticky:  # behind HAProxy a browser first loads the page, and gets the cookie naming its process
            self.backend = await asyncio.to_thread(self._page_cookie)
            headers["Cookie"] = f"EXPLORER={self.backend}"
        self.ws = await websockets.connect(self.url, subprotocols=["streamlit"], max_size=None,
                                           open_timeout=self.timeout, additional_headers=headers)

    def _page_cookie(self) -> str:
        import urllib.request

        with urllib.request.urlopen(self.url.replace("ws://", "http://").replace("/_stcore/stream", "/"),
                                    timeout=self.timeout) as r:
            cookie = r.headers.get("Set-Cookie", "")
        if not cookie.startswith("EXPLORER="):
            raise RuntimeError(f"no EXPLORER cookie from the load balancer ({cookie!r})")
        return cookie.split(";", 1)[0].split("=", 1)[1]

    async def close(self) -> None:
        """Close the connection; a connection already gone is closed too (never raises)."""
        if self.ws is not None:
            try:
                await self.ws.close()
            except Exception:
                pass

    async def rerun(self, query: str = "", widget: tuple[str, str, object] | None = None) -> tuple[float, list[str]]:
        """One script run; (seconds until script_finished, problems seen on the page)."""
        from streamlit.proto.BackMsg_pb2 import BackMsg

        msg = BackMsg()
        msg.rerun_script.query_string = query
        if widget is not None:
            key, kind, value = widget
            ws = msg.rerun_script.widget_states.widgets.add()
            ws.id = self.ids[key]
            if kind == "string":
                ws.string_value = value
            elif kind == "double_array":
                ws.double_array_value.data[:] = value
            elif kind == "trigger":  # a button press
                ws.trigger_value = True
            else:
                ws.string_array_value.data[:] = value
        t0 = time.perf_counter()
        await self.ws.send(msg.SerializeToString())
        problems = await asyncio.wait_for(self._read_run(), self.timeout)
        return time.perf_counter() - t0, problems

    async def _read_run(self) -> list[str]:
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        problems = []
        while True:
            f = ForwardMsg()
            f.ParseFromString(await self.ws.recv())
            problems += self.take(f)
            if f.WhichOneof("type") == "script_finished":
                if f.script_finished != ForwardMsg.FINISHED_SUCCESSFULLY:
                    problems.append(f"script_finished status {f.script_finished}")
                return problems

    def take(self, f) -> list[str]:
        """What one message from the server tells about the page (widget ids, slider ranges, download buttons, the
        view selector's labels, the session, the URL); returns the problems it shows (exceptions, error alerts)."""
        from streamlit.proto.Alert_pb2 import Alert

        problems = []
        kind = f.WhichOneof("type")
        if kind == "delta" and f.delta.WhichOneof("type") == "new_element":
            el_kind = f.delta.new_element.WhichOneof("type")
            el = getattr(f.delta.new_element, el_kind)
            if getattr(el, "id", ""):
                self.ids[el.id.rsplit("-", 1)[-1]] = el.id
                if el_kind == "slider":  # the layer and head sliders' ranges: the model's shape
                    self.limits[el.id.rsplit("-", 1)[-1]] = int(el.max)
            if el_kind == "download_button" and el.deferred_file_id:
                self.downloads[el.id.rsplit("-", 1)[-1]] = el.deferred_file_id
            if el_kind == "button_group":
                self.view_labels = [o.content for o in el.options]
            if el_kind == "exception":
                problems.append(f"exception: {el.type}: {el.message}")
            elif el_kind == "alert" and el.format == Alert.ERROR:
                problems.append(f"error: {el.body[:200]}")
        elif kind == "new_session" and f.new_session.initialize.session_id:
            self.session_id = f.new_session.initialize.session_id
        elif kind == "page_info_changed":
            self.query = {k: v[0] for k, v in parse_qs(f.page_info_changed.query_string).items()}
        return problems

    async def download(self, key: str) -> tuple[float, int, str]:
        """Click download button `key` as a browser does: ask the server for the file (Streamlit's deferred-file
        request, which runs the page's data callable), then fetch it. (seconds, bytes, problem or "")."""
        import urllib.request

        from streamlit.proto.BackMsg_pb2 import BackMsg
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        if key not in self.downloads:
            return 0.0, 0, f"no download button {key!r} on the page"
        msg = BackMsg()
        msg.backend_operation_request.request_id = f"{key}-{time.monotonic_ns()}"
        msg.backend_operation_request.session_id = self.session_id
        msg.backend_operation_request.deferred_file.file_id = self.downloads[key]
        t0 = time.perf_counter()
        await self.ws.send(msg.SerializeToString())

        async def answer():
            while True:
                f = ForwardMsg()
                f.ParseFromString(await self.ws.recv())
                if f.WhichOneof("type") == "backend_operation_response":
                    return f.backend_operation_response
        r = await asyncio.wait_for(answer(), self.timeout)
        if r.error_msg:
            return time.perf_counter() - t0, 0, f"download refused: {r.error_msg}"
        base = self.url.replace("ws://", "http://").replace("/_stcore/stream", "")

        def fetch() -> int:
            size = 0
            with urllib.request.urlopen(base + r.deferred_file.url, timeout=self.timeout) as body:
                while chunk := body.read(1 << 20):
                    size += len(chunk)
            return size
        size = await asyncio.to_thread(fetch)
        return time.perf_counter() - t0, size, ""

    def mismatch(self, **wanted) -> list[str]:
        return [f"URL has {k}={self.query.get(k)!r}, expected {v!r}" for k, v in wanted.items()
                if self.query.get(k) != str(v)]
