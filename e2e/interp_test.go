package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"image/png"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/client"
)

// onlyWith returns the one result of ex that has key ("chart", "data",
// "png"), failing the test when there is not exactly one.
func onlyWith(t *testing.T, ex rawExec, key string) map[string]any {
	t.Helper()
	var found []map[string]any
	for _, r := range ex.Results {
		if r[key] != nil {
			found = append(found, r)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one result with %s, got %d: %v", key, len(found), ex.Results)
	}
	return found[0]
}

// rawExec is an Execution decoded loosely, to assert on the JSON users get.
type rawExec struct {
	Error   map[string]any   `json:"error"`
	Results []map[string]any `json:"results"`
	Stdout  string           `json:"stdout"`
	Stderr  string           `json:"stderr"`
	Text    string           `json:"text"`
}

// runRaw runs code in the sandbox's default Python context through
// POST /run_code and decodes the answer as JSON.
func runRaw(t *testing.T, s *server, sbID, code string) rawExec {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"code": code, "timeout_seconds": 120})
	status, raw := rawCall(t, s, "POST", "/v1/sandboxes/"+sbID+"/run_code", string(body))
	if status != 200 {
		t.Fatalf("run_code %q: %d %s", code, status, raw)
	}
	var ex rawExec
	if err := json.Unmarshal(raw, &ex); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	if ex.Error != nil {
		t.Fatalf("run_code %q: error %v", code, ex.Error)
	}
	return ex
}

// rawCall makes an authenticated API call and returns the status and body.
func rawCall(t *testing.T, s *server, method, path, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, s.url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// sameJSON compares got, as JSON, with the JSON text want.
func sameJSON(t *testing.T, what string, got any, want string) {
	t.Helper()
	var w any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad expectation %s: %v", want, err)
	}
	g, _ := json.Marshal(got)
	var gv any
	json.Unmarshal(g, &gv)
	if !reflect.DeepEqual(gv, w) {
		t.Errorf("%s:\n got %s\nwant %s", what, g, want)
	}
}

// TestStructuredCharts plots each kind of chart with matplotlib and checks
// that the chart beside the PNG holds the data that was plotted.
func TestStructuredCharts(t *testing.T) {
	s := sharedServer(t)
	sb, _ := codeSandbox(t, s)
	runRaw(t, s, sb.ID, "import matplotlib.pyplot as plt")

	t.Run("line", func(t *testing.T) {
		ex := runRaw(t, s, sb.ID, `fig, ax = plt.subplots()
ax.plot([1, 2, 3], [2, 4, 8], label="doubling")
ax.plot([1, 2, 3], [3, 2, 1], label="falling")
ax.set_title("Growth"); ax.set_xlabel("day"); ax.set_ylabel("count"); ax.set_yscale("log")
plt.show()`)
		r := onlyWith(t, ex, "chart")
		if r["png"] == nil {
			t.Fatalf("chart without its PNG: %v", r)
		}
		c := r["chart"].(map[string]any)
		sameJSON(t, "line head", []any{c["type"], c["title"], c["x_label"], c["y_label"], c["x_scale"], c["y_scale"]},
			`["line", "Growth", "day", "count", "linear", "log"]`)
		sameJSON(t, "line elements", c["elements"],
			`[{"label": "doubling", "points": [[1, 2], [2, 4], [3, 8]]}, {"label": "falling", "points": [[1, 3], [2, 2], [3, 1]]}]`)
		if ticks, labels := c["x_ticks"].([]any), c["x_tick_labels"].([]any); len(ticks) == 0 || len(ticks) != len(labels) {
			t.Errorf("x ticks %v, labels %v", ticks, labels)
		}
	})
	t.Run("scatter", func(t *testing.T) {
		ex := runRaw(t, s, sb.ID, `plt.scatter([0.5, 1.5, 2.5], [10, 20, 15], label="samples")
plt.show()`)
		c := onlyWith(t, ex, "chart")["chart"].(map[string]any)
		sameJSON(t, "scatter", []any{c["type"], c["elements"]},
			`["scatter", [{"label": "samples", "points": [[0.5, 10], [1.5, 20], [2.5, 15]]}]]`)
	})
	t.Run("grouped bars", func(t *testing.T) {
		ex := runRaw(t, s, sb.ID, `import numpy as np
x = np.arange(3)
fig, ax = plt.subplots()
ax.bar(x - 0.2, [5, 7, 3], width=0.4, label="2024")
ax.bar(x + 0.2, [6, 2, 4], width=0.4, label="2025")
ax.set_xticks(x, ["apples", "pears", "plums"])
plt.show()`)
		c := onlyWith(t, ex, "chart")["chart"].(map[string]any)
		sameJSON(t, "bar", []any{c["type"], c["elements"]}, `["bar", [
			{"label": "apples", "value": 5, "group": "2024"}, {"label": "pears", "value": 7, "group": "2024"}, {"label": "plums", "value": 3, "group": "2024"},
			{"label": "apples", "value": 6, "group": "2025"}, {"label": "pears", "value": 2, "group": "2025"}, {"label": "plums", "value": 4, "group": "2025"}]]`)
	})
	t.Run("categorical bar", func(t *testing.T) {
		ex := runRaw(t, s, sb.ID, `plt.bar(["red", "green"], [3, 9]); plt.title("Colours"); plt.show()`)
		c := onlyWith(t, ex, "chart")["chart"].(map[string]any)
		sameJSON(t, "categorical bar", []any{c["type"], c["title"], c["x_scale"], c["elements"]},
			`["bar", "Colours", "categorical", [{"label": "red", "value": 3, "group": null}, {"label": "green", "value": 9, "group": null}]]`)
	})
	t.Run("pie", func(t *testing.T) {
		ex := runRaw(t, s, sb.ID, `plt.pie([1, 1, 2], labels=["a", "b", "c"]); plt.show()`)
		c := onlyWith(t, ex, "chart")["chart"].(map[string]any)
		sameJSON(t, "pie", []any{c["type"], c["elements"]},
			`["pie", [{"label": "a", "angle": 90, "radius": 1}, {"label": "b", "angle": 90, "radius": 1}, {"label": "c", "angle": 180, "radius": 1}]]`)
	})
	t.Run("box and whisker", func(t *testing.T) {
		ex := runRaw(t, s, sb.ID, `plt.boxplot([[1, 2, 3, 4, 5, 40], [10, 20, 30]], tick_labels=["low", "high"]); plt.show()`)
		c := onlyWith(t, ex, "chart")["chart"].(map[string]any)
		sameJSON(t, "box", []any{c["type"], c["elements"]}, `["box_and_whisker", [
			{"label": "low", "min": 1, "first_quartile": 2.25, "median": 3.5, "third_quartile": 4.75, "max": 5, "outliers": [40]},
			{"label": "high", "min": 10, "first_quartile": 15, "median": 20, "third_quartile": 25, "max": 30, "outliers": []}]]`)
	})
	t.Run("superchart", func(t *testing.T) {
		ex := runRaw(t, s, sb.ID, `fig, (a, b) = plt.subplots(1, 2)
a.plot([0, 1], [1, 0]); b.pie([1, 3]); fig.suptitle("Two")
plt.show()`)
		c := onlyWith(t, ex, "chart")["chart"].(map[string]any)
		els, _ := c["elements"].([]any)
		if c["type"] != "superchart" || c["title"] != "Two" || len(els) != 2 ||
			els[0].(map[string]any)["type"] != "line" || els[1].(map[string]any)["type"] != "pie" {
			t.Fatalf("superchart: %v", c)
		}
	})
	t.Run("pandas time series", func(t *testing.T) {
		// df.plot() of a regular DatetimeIndex puts period ordinals on the
		// x axis, not matplotlib's date numbers: the points still say dates.
		ex := runRaw(t, s, sb.ID, `import pandas as pd
pd.DataFrame({"v": [1, 2, 3]}, index=pd.date_range("2024-01-01", periods=3, freq="D")).plot()
plt.show()`)
		c := onlyWith(t, ex, "chart")["chart"].(map[string]any)
		sameJSON(t, "time series", []any{c["x_scale"], c["elements"].([]any)[0].(map[string]any)["points"]},
			`["datetime", [["2024-01-01T00:00:00", 1], ["2024-01-02T00:00:00", 2], ["2024-01-03T00:00:00", 3]]]`)
	})
	t.Run("points are capped", func(t *testing.T) {
		ex := runRaw(t, s, sb.ID, `plt.plot(range(20000)); plt.show()`)
		c := onlyWith(t, ex, "chart")["chart"].(map[string]any)
		pts := c["elements"].([]any)[0].(map[string]any)["points"].([]any)
		if c["truncated"] != true || len(pts) != 5000 {
			t.Fatalf("20000 points: truncated %v, %d kept", c["truncated"], len(pts))
		}
	})
}

// TestStructuredTables checks a DataFrame's and a Series' data.
func TestStructuredTables(t *testing.T) {
	s := sharedServer(t)
	sb, _ := codeSandbox(t, s)
	ex := runRaw(t, s, sb.ID, `import pandas as pd
df = pd.DataFrame({"city": ["Oslo", "Lima"], "temp": [3.5, None], "when": pd.to_datetime(["2024-01-01", "2024-07-01"])})
df`)
	r := onlyWith(t, ex, "data")
	if !r["is_main_result"].(bool) || !strings.Contains(r["html"].(string), "<table") {
		t.Fatalf("the DataFrame's result lost its HTML: %v", r)
	}
	d := r["data"].(map[string]any)
	sameJSON(t, "DataFrame", []any{d["kind"], d["columns"], d["dtypes"], d["index"], d["rows"], d["total_rows"], d["truncated"]},
		`["dataframe", ["city", "temp", "when"], ["str", "float64", "datetime64[us]"], [0, 1],
		  [["Oslo", 3.5, "2024-01-01T00:00:00.000"], ["Lima", null, "2024-07-01T00:00:00.000"]], 2, null]`)

	ex = runRaw(t, s, sb.ID, `display(pd.Series([1, 2, 3], name="n", index=["a", "b", "c"]))`)
	d = onlyWith(t, ex, "data")["data"].(map[string]any)
	sameJSON(t, "Series", []any{d["kind"], d["name"], d["columns"], d["index"], d["rows"]},
		`["series", "n", ["n"], ["a", "b", "c"], [[1], [2], [3]]]`)

	ex = runRaw(t, s, sb.ID, `pd.DataFrame({"i": range(5000)})`)
	d = onlyWith(t, ex, "data")["data"].(map[string]any)
	if d["truncated"] != true || d["total_rows"].(float64) != 5000 || len(d["rows"].([]any)) != 1000 {
		t.Fatalf("5000 rows: truncated %v, total %v, %d kept", d["truncated"], d["total_rows"], len(d["rows"].([]any)))
	}
}

// TestOutputKinds checks PIL images and the display formats carried through.
func TestOutputKinds(t *testing.T) {
	s := sharedServer(t)
	sb, _ := codeSandbox(t, s)
	decodePNG := func(t *testing.T, b64 any) {
		t.Helper()
		raw, err := base64.StdEncoding.DecodeString(b64.(string))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(raw))
		if err != nil || img.Bounds().Dx() != 40 || img.Bounds().Dy() != 30 {
			t.Fatalf("PNG: %v", err)
		}
	}
	t.Run("PIL image as the cell's value", func(t *testing.T) {
		ex := runRaw(t, s, sb.ID, `from PIL import Image
img = Image.new("RGB", (40, 30), "red")
img`)
		decodePNG(t, onlyWith(t, ex, "png")["png"])
	})
	t.Run("PIL Image.show", func(t *testing.T) {
		ex := runRaw(t, s, sb.ID, `Image.new("L", (40, 30), 128).show()`)
		decodePNG(t, onlyWith(t, ex, "png")["png"])
	})
	t.Run("display formats", func(t *testing.T) {
		ex := runRaw(t, s, sb.ID, `from IPython.display import display, JSON, SVG, Latex, Markdown, Javascript
display(JSON({"a": [1, 2]}))
display(SVG('<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect width="4" height="4"/></svg>'))
display(Latex(r"$x^2$"))
display(Markdown("**bold**"))
display(Javascript("console.log(1)"))`)
		got := map[string]any{}
		for _, r := range ex.Results {
			for _, k := range []string{"json", "svg", "latex", "markdown", "javascript"} {
				if r[k] != nil {
					got[k] = r[k]
				}
			}
		}
		if !strings.Contains(got["svg"].(string), "<rect") {
			t.Errorf("svg %v", got["svg"])
		}
		sameJSON(t, "formats", []any{got["json"], got["latex"], got["markdown"], got["javascript"]},
			`[{"a": [1, 2]}, "$x^2$", "**bold**", "console.log(1)"]`)
	})
}

// TestCommonPackages: what agents reach for beside the data stack is
// there, offline: progress bars, symbolic maths, HTML parsing, Word and
// old Excel files.
func TestCommonPackages(t *testing.T) {
	s := sharedServer(t)
	sb, _ := codeSandbox(t, s)
	ex := runRaw(t, s, sb.ID, `from tqdm.auto import tqdm
total = sum(tqdm(range(3)))
import sympy
x = sympy.symbols("x")
from bs4 import BeautifulSoup
title = BeautifulSoup("<html><title>hi</title><p>x</p></html>", "lxml").title.string
import docx
d = docx.Document(); d.add_paragraph("hello"); d.save("/tmp/t.docx")
import xlrd
import pandas as pd
styled = "<table" in pd.DataFrame({"a": [1]}).style.highlight_max().to_html()
print(total, sympy.integrate(x**2, x), title, docx.Document("/tmp/t.docx").paragraphs[0].text, xlrd.__version__, styled)`)
	if ex.Stdout != "3 x**3/3 hi hello 2.0.2 True\n" {
		t.Errorf("stdout %q", ex.Stdout)
	}
	// pip installs as the user (here from nowhere: no index), where
	// Debian's marker refused every install, network or not.
	res, err := s.client().Exec(t.Context(), sb.ID, client.ExecRequest{Cmd: "pip install --no-index zzz-not-a-package 2>&1; true"})
	if err != nil || strings.Contains(res.Stdout, "externally-managed") || !strings.Contains(res.Stdout, "No matching distribution") {
		t.Errorf("pip install: %v %q", err, res.Stdout)
	}
	// tqdm.auto's text bar, without the warning that ipywidgets is
	// missing (which sends an agent off to install them).
	if !strings.Contains(ex.Stderr, "3/3") || strings.Contains(ex.Stderr, "ipywidgets") {
		t.Errorf("tqdm's progress bar is not in stderr, or not alone: %q", ex.Stderr)
	}
}
