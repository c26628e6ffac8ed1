"""The adversarial visitor of the load test: what one visitor can ask of a shared server that costs the most, a
what-if link with thousands of changes, a long prompt compared with its no-mask twin (side B), the recording's .npz
download, and the lab's experiment button pressed again and again. Each is answered (or refused in one line) without
holding up the others for long; the ordinary visitors' p95 with and without one beside them is the measure
(bench/bench_load.py --adversaries 1)."""
from __future__ import annotations

import asyncio
import collections
import random
import time
from urllib.parse import urlencode

from .visitor import Visitor, make_prompts

ADVERSARY_ACTIONS = ("adv_long_whatif", "adv_huge_b", "adv_download", "adv_lab_flood")
LONG_WHATIF_ITEMS = 2500
LAB_PRESSES = 6


def long_prompt(sentences: int = 60) -> str:
    """Far longer than the server's token cap: the page records (and compares) the longest prompt it allows."""
    return " ".join(make_prompts(999, sentences, sentences))


async def adversary_run(n: int, port: int, args, deadline: float, times: dict[str, list[float]],
                        errors: list[dict], refusals: collections.Counter) -> int:
    """One adversarial visitor's rounds (args.prompts of them). A refusal on the page (an error alert) is the answer
    it should get and is counted in `refusals` (with the bytes downloaded); an exception, a timeout or a failed download is an error."""
    rng = random.Random(args.seed * 104729 + n)
    await asyncio.sleep(rng.uniform(0, args.ramp))
    v = Visitor(port, args.timeout, sticky=args.processes > 1)
    done, action = 0, "open"

    async def act(name: str, query: str = "", widget=None) -> None:
        nonlocal done, action, v
        action = name
        if query:  # a link is read when a page opens: each one in a new tab, as a visitor pasting it would
            await v.close()
            v = Visitor(port, args.timeout, sticky=args.processes > 1)
            await v.connect()
        dt, problems = await v.rerun(query, widget)
        times.setdefault(name, []).append(dt)
        for p in problems:
            if p.startswith("error: "):
                refusals[f"{name} refused"] += 1
            else:
                errors.append({"visitor": n, "action": name, "problem": p})
        done += 1
        await asyncio.sleep(rng.uniform(0.5, 1.5) * args.think)

    try:
        await v.connect()
        for _ in range(max(1, args.prompts)):
            if time.monotonic() > deadline:
                break
            # distinct changes (repeats of one change collapse into one): more than the model has heads
            changes = ",".join(f"scale:blocks.{i % 30}.hook_attn_out=1.{i:04d}" for i in range(LONG_WHATIF_ITEMS))
            await act("adv_long_whatif", urlencode({"view": "whatif", "whatif": changes}))
            await act("adv_huge_b", urlencode({"view": "attention", "prompt": long_prompt(), "cmp": "whatif",
                                              "cmp_iv": "no-mask"}))
            action = "adv_download"
            if "download_npz" not in v.downloads:  # over the server's download cap: refused before a click
                refusals["adv_download refused"] += 1
            else:
                dt, size, problem = await v.download("download_npz")
                times.setdefault("adv_download", []).append(dt)
                if problem:
                    errors.append({"visitor": n, "action": "adv_download", "problem": problem})
                else:
                    refusals["downloaded bytes"] += size
            done += 1
            await act("adv_lab_flood", urlencode({"view": "normlab"}))
            for _ in range(LAB_PRESSES):
                if "lab_init_run" in v.ids:
                    await act("adv_lab_flood", widget=("lab_init_run", "trigger", True))
    except asyncio.TimeoutError:
        errors.append({"visitor": n, "action": action, "problem": f"timeout: no answer within {args.timeout} s"})
    except Exception as e:
        errors.append({"visitor": n, "action": action, "problem": f"{type(e).__name__}: {e}"})
    finally:
        await v.close()
    return done
