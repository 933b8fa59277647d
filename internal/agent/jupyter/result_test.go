package jupyter

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// TestToResultStructuredData checks that the template extension's MIME types
// land in Chart and Data, decoded, and nowhere else.
func TestToResultStructuredData(t *testing.T) {
	data := map[string]json.RawMessage{
		"text/plain":          json.RawMessage(`"<Figure>"`),
		"image/png":           json.RawMessage(`"iVBO\nRw=="`),
		agentproto.ChartMIME:  json.RawMessage(`{"type":"line","elements":[{"label":"a","points":[[1,2]]}]}`),
		agentproto.TableMIME:  json.RawMessage(`{"columns":["a"],"rows":[[1]]}`),
		"application/x-other": json.RawMessage(`{"k":1}`),
	}
	res := toResult(data, false)
	if res.PNG != "iVBORw==" || res.Text != "<Figure>" {
		t.Fatalf("png %q text %q", res.PNG, res.Text)
	}
	wantChart := map[string]any{"type": "line", "elements": []any{map[string]any{"label": "a", "points": []any{[]any{1.0, 2.0}}}}}
	if !reflect.DeepEqual(res.Chart, wantChart) {
		t.Fatalf("chart %#v", res.Chart)
	}
	if !reflect.DeepEqual(res.Data, map[string]any{"columns": []any{"a"}, "rows": []any{[]any{1.0}}}) {
		t.Fatalf("data %#v", res.Data)
	}
	if len(res.Extra) != 1 || res.Extra["application/x-other"] == nil {
		t.Fatalf("extra %#v", res.Extra)
	}
	b, _ := json.Marshal(res)
	var back map[string]any
	json.Unmarshal(b, &back)
	if back["chart"] == nil || back["data"] == nil {
		t.Fatalf("wire form %s", b)
	}
}

// A kernel's error without a name (bash_kernel's failed command: the exit
// status as the value) is named "Error"; a named one keeps its name.
func TestErrorNames(t *testing.T) {
	for _, tc := range []struct{ ename, evalue, want string }{
		{"", "1", "Error"},
		{" ", "Cell has trailing backslash", "Error"},
		{"ValueError", "bad", "ValueError"},
	} {
		e := errorContent{Ename: tc.ename, Evalue: tc.evalue, Traceback: []string{"\x1b[31mline\x1b[0m"}}.toError()
		if e.Name != tc.want || e.Value != tc.evalue || e.Traceback != "line" {
			t.Errorf("%q/%q: %+v", tc.ename, tc.evalue, e)
		}
	}
}

// A run whose stdout ends with the kernel's restart line (bash_kernel's,
// after a cell's exit) answers ShellExited; one that only prints the line
// earlier, or has an error of its own, does not.
func TestShellExited(t *testing.T) {
	for _, tc := range []struct {
		out    string
		reply  bool
		marker string
		want   bool
		flood  bool // after more output than the cap keeps
	}{
		{"bye\nRestarting Bash", false, BashShellExited, true, false},
		{"bye\nRestarting Bash\r\n", false, BashShellExited, true, false},
		{"Restarting Bash\nand on", false, BashShellExited, false, false},
		{"bye\nRestarting Bash", true, BashShellExited, false, false},
		{"bye\nRestarting Bash", false, "", false, false},
		{"exit\nRestarting Bash\n", false, BashShellExited, true, true},
	} {
		r := newRun(1 << 20)
		if tc.flood {
			r = newRun(10)
			r.onStream("stdout", strings.Repeat("y", 100))
		}
		r.onStream("stdout", tc.out)
		if tc.reply {
			r.replyErr = &agentproto.ExecutionError{Name: "Error", Value: "1"}
		}
		e := r.shellExited(tc.marker)
		if (e != nil) != tc.want || (e != nil && e.Name != "ShellExited") {
			t.Errorf("%q (reply error %v, marker %q): %+v", tc.out, tc.reply, tc.marker, e)
		}
	}
}

// With value displays (IRkernel), the last display that is not an image is
// the main result and gives the text; a run that has a main result, or
// only images, is left as it is.
func TestMainValue(t *testing.T) {
	value := func(s string) agentproto.Result { return agentproto.Result{Text: s} }
	plot := agentproto.Result{Text: "plot without title", PNG: "iVBO"}
	for _, tc := range []struct {
		name    string
		results []agentproto.Result
		want    int // index of the main result; -1 none
	}{
		{"values and a plot", []agentproto.Result{value("[1] 1"), value("[1] 2"), plot}, 1},
		{"a plot only", []agentproto.Result{plot}, -1},
		{"a main result already", []agentproto.Result{{Text: "x", IsMainResult: true}, value("[1] 2")}, 0},
		{"the truncation marker", []agentproto.Result{value("[1] 1"), value("[results truncated: this cell's outputs passed 32 MiB; later ones are omitted]")}, -1},
	} {
		e := agentproto.Execution{Results: tc.results}
		if i := slices.IndexFunc(tc.results, func(r agentproto.Result) bool { return r.IsMainResult }); i >= 0 {
			e.Text = tc.results[i].Text // as onResult sets it
		}
		mainValue(&e)
		got := slices.IndexFunc(e.Results, func(r agentproto.Result) bool { return r.IsMainResult })
		if got != tc.want || (got >= 0 && e.Text != e.Results[got].Text) {
			t.Errorf("%s: main %d text %q, want main %d", tc.name, got, e.Text, tc.want)
		}
	}
}

// Plotly's notebook setup script is no result; a figure's HTML, or HTML
// with more than the script, is.
func TestPlotlyInit(t *testing.T) {
	script := `"<script>\nwindow.PlotlyConfig = {MathJaxConfig: 'local'};\n</script>\n<script type=\"module\">import \"https://cdn.plot.ly/plotly-3.0.1.min\"</script>"`
	figure := `"<div id=\"f\"></div><script>window.PlotlyConfig = {MathJaxConfig: 'local'};</script>"`
	for _, tc := range []struct {
		data map[string]json.RawMessage
		want bool
	}{
		{map[string]json.RawMessage{"text/html": json.RawMessage(script)}, true},
		{map[string]json.RawMessage{"text/html": json.RawMessage(figure)}, false},
		{map[string]json.RawMessage{"text/html": json.RawMessage(script), "text/plain": json.RawMessage(`"x"`)}, false},
		{map[string]json.RawMessage{"text/html": json.RawMessage(`"<b>hi</b>"`)}, false},
	} {
		if got := plotlyInit(tc.data); got != tc.want {
			t.Errorf("%v: %v", tc.data, got)
		}
	}
}

// A kernel that announces no execute_input (the Python setup turns it off)
// has begun the cell once it reports busy: a timeout's interrupt then waits
// only the settle time, not beginWait.
func TestBusyStartsTheCell(t *testing.T) {
	r := newRun(1 << 20)
	if _, ok := r.beganAt(); ok {
		t.Fatal("a run began before any message")
	}
	r.handle("iopub", &message{Header: header{MsgType: "status"}, Content: json.RawMessage(`{"execution_state":"busy"}`)})
	if _, ok := r.beganAt(); !ok {
		t.Fatal("busy did not begin the cell")
	}
	select {
	case <-r.started:
	default:
		t.Fatal("started is still open")
	}
	// An execute_input after it changes nothing (and does not close twice).
	r.handle("iopub", &message{Header: header{MsgType: "execute_input"}, Content: json.RawMessage(`{}`)})
}
