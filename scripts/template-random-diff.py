#!/usr/bin/env python3
"""Random differential test of kiln's chat templates against Python jinja2.

Generates random conversations (roles, unicode/escaping-heavy contents, multimodal
lists, reasoning, tool calls with dict or string arguments, tool results, tools,
enable_thinking) and renders every template of a folder with both jinja2 (in
transformers' environment, from gen-template-goldens.py) and `kiln template`; reports
every case where the bytes differ or only one side fails, saving it to $OUT_DIR.

usage: scripts/template-random-diff.py SEED N   (env: TDIR templates folder, KILN binary,
       OUT_DIR for failing cases; run from the repository root after building)
"""
import json, random, subprocess, os, sys, tempfile, importlib.util
HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("g", os.path.join(HERE, "gen-template-goldens.py"))
g = importlib.util.module_from_spec(spec); spec.loader.exec_module(g)
env = g.make_env()
R = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
ATOMS = ["hello", "  spaced  ", "line1\nline2", "tab\there", "quote \"q\" 'a'", "back\\slash", "日本語", "🎉", "<html>&", "{{ not jinja }}", "{% raw %}", "", " ", "\n", "x" * 50, "null", "123", "é"]
def text(): return "".join(R.choice(ATOMS) for _ in range(R.randint(0, 3)))
def args():
    d = {}
    for _ in range(R.randint(0, 3)):
        d[R.choice(["city", "query", "n", "flag", "list", "obj"])] = R.choice([text(), R.randint(-5, 100), 1.5, True, None, [1, "a"], {"k": text()}])
    return d
def tool_call(i):
    a = args()
    return {"id": f"call{i:05d}"[:9].ljust(9, "x"), "type": "function", "function": {"name": R.choice(["get_weather", "search"]), "arguments": a if R.random() < 0.8 else json.dumps(a)}}
def conv():
    msgs = []
    if R.random() < 0.5: msgs.append({"role": "system", "content": text()})
    for t in range(R.randint(1, 4)):
        msgs.append({"role": "user", "content": text() if R.random() < 0.9 else [{"type": "text", "text": text()}]})
        if R.random() < 0.7 or t < 1:
            m = {"role": "assistant", "content": text()}
            if R.random() < 0.3: m["reasoning_content"] = text()
            if R.random() < 0.3:
                m["tool_calls"] = [tool_call(t * 10 + k) for k in range(R.randint(1, 2))]
                if R.random() < 0.5: m["content"] = None if R.random() < 0.5 else ""
                msgs.append(m)
                for tc in m["tool_calls"]:
                    msgs.append({"role": "tool", "tool_call_id": tc["id"], "name": tc["function"]["name"], "content": text()})
                continue
            msgs.append(m)
    if msgs[-1]["role"] != "user" and R.random() < 0.5: msgs.append({"role": "user", "content": text()})
    c = {"messages": msgs}
    if R.random() < 0.5: c["tools"] = [g.WEATHER_TOOL, g.SEARCH_TOOL][: R.randint(1, 2)]
    if R.random() < 0.3: c["vars"] = {"enable_thinking": R.random() < 0.5}
    return c
tdir = os.environ.get("TDIR", os.path.join(HERE, "..", "..", "shared", "testdata", "templates"))
kiln = os.environ.get("KILN", os.path.join(HERE, "..", "build", "kiln"))
work = tempfile.mkdtemp()
out_dir = os.environ.get("OUT_DIR", work)
names = sorted(os.listdir(tdir))
N = int(sys.argv[2]) if len(sys.argv) > 2 else 20
bad = total = 0
for i in range(N):
    c = conv(); agp = R.random() < 0.5
    json.dump(c["messages"], open(os.path.join(work, "m.json"), "w"))
    json.dump(c.get("tools"), open(os.path.join(work, "t.json"), "w"))
    json.dump(c.get("vars", {}), open(os.path.join(work, "v.json"), "w"))
    for name in names:
        src = open(os.path.join(tdir, name), encoding="utf-8").read()
        want = g.render_case(env, src, c, agp)
        cmd = [kiln, "template", "--template", os.path.join(tdir, name), "--messages", os.path.join(work, "m.json"), "--vars", os.path.join(work, "v.json"), "--bos", "<s>", "--eos", "</s>"]
        if "tools" in c: cmd += ["--tools", os.path.join(work, "t.json")]
        if agp: cmd.append("--add-generation-prompt")
        r = subprocess.run(cmd, capture_output=True, env=dict(os.environ, KILN_TEMPLATE_NOW=g.NOW))
        total += 1
        ok = (r.returncode == 0 and r.stdout.decode() == want["output"]) if "output" in want else r.returncode != 0
        if not ok:
            bad += 1
            fn = os.path.join(out_dir, f"fail_{i}_{name}.json")
            json.dump({"conv": c, "agp": agp, "want": want, "got": r.stdout.decode(errors="replace"), "err": r.stderr.decode()}, open(fn, "w"), ensure_ascii=False, indent=1)
            print("BAD", name, i, want.get("error", "")[:80], r.stderr.decode()[:150])
print(total, "cases", bad, "bad")
sys.exit(1 if bad else 0)
