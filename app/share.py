"""The room's address on a shared server, for the projector: every address students can open, the first as a QR code.

The addresses carry the page's language and the room's lecture and step (the lecture this page shows where the
server has no room), so a student who scans the code lands on what the projector shows, in its language. They open
in a popover beside the title: closed, it takes no height, so the view's controls stay on the first screen.
"""
from __future__ import annotations

import functools
import io
import urllib.parse

import streamlit as st

from app import lecture_player, room_follow
from app.i18n import t
from explorer_model import lecture as L


def tr(key: str, **values) -> str:
    return t(key, st.session_state.get("lang", "en"), **values)


def room_addresses() -> list[str]:
    from explorer_model.cli import serve

    return serve.lan_addresses()  # every non-loopback interface, read from the kernel


@functools.lru_cache(maxsize=32)
def qr_svg(url: str) -> str:
    """The address as a QR code, made once per address (every page run of a shared server shows it). SVG: it
    stays sharp at any size, and Streamlit sends it as it is, where a PNG wider than its frame would be decoded,
    scaled and encoded again at every page run."""
    import segno  # pure Python; only needed on a shared server

    buf = io.BytesIO()
    segno.make(url, error="m").save(buf, kind="svg", scale=8, border=2, xmldecl=False)
    return buf.getvalue().decode("ascii")


def room_lecture() -> dict[str, str]:
    """{"lecture", "step"} of the lecture the room follows (a shipped one: an uploaded file has no name a link
    could give), else of the lecture this page shows; {} when there is none."""
    r = room_follow.room()
    current = r.current() if r is not None else None
    if current is not None:
        name = current.get("name") or ""
        if not L.NAME.match(name):  # the room follows an uploaded lecture: its pages get it from the room
            return {}
        return {"lecture": name, "step": str(int(current.get("step") or 0) + 1)}
    return lecture_player.url_params()


def addresses(port: int) -> list[str]:
    query = urllib.parse.urlencode({"lang": st.session_state.get("lang", "en"), **room_lecture()})
    return [f"http://{a}:{port}/?{query}" for a in room_addresses()]


def box(place, port: int) -> None:
    """The addresses and the QR code of the first, in a popover at `place`."""
    urls = addresses(port)
    if not urls:
        return
    with place.popover(tr("sidebar.share_button"), icon=":material/qr_code_2:", help=tr("sidebar.share_title"),
                       width="stretch"):
        st.code("\n".join(urls), language=None)
        st.image(qr_svg(urls[0]), caption=tr("sidebar.share_caption", url=urls[0]), width=240)
