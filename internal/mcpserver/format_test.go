package mcpserver

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pandastack/pandastack/client"
)

func pngBase64(t *testing.T) (string, []byte) {
	t.Helper()
	img := image.NewGray(image.Rect(0, 0, 4, 3))
	img.Set(1, 1, color.White)
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b.Bytes()), b.Bytes()
}

func TestExecutionResult(t *testing.T) {
	b64, raw := pngBase64(t)
	// Jupyter may break base64 into lines; the image must survive that.
	wrapped := b64[:10] + "\n" + b64[10:] + "\n"
	ex := &client.Execution{
		Stdout: "hi\n",
		Stderr: "careful\n",
		Results: []client.Result{
			{Text: "<Figure size 640x480 with 1 Axes>", PNG: wrapped},
			{Text: "<Figure size 640x480 with 1 Axes>", PNG: b64},
			{IsMainResult: true, Text: "42"},
		},
	}
	res := executionResult(ex)
	if res.IsError {
		t.Fatal("isError without an error")
	}
	if len(res.Content) != 3 {
		t.Fatalf("want text + 2 images, got %d blocks", len(res.Content))
	}
	txt := res.Content[0].(*mcp.TextContent).Text
	want := "hi\n\n[stderr]\ncareful\n\n[chart] image/png attached as image 1\n\n[chart] image/png attached as image 2\n\n[result] 42"
	if txt != want {
		t.Fatalf("text\n%q\nwant\n%q", txt, want)
	}
	for _, c := range res.Content[1:] {
		img := c.(*mcp.ImageContent)
		if img.MIMEType != "image/png" || !bytes.Equal(img.Data, raw) {
			t.Fatalf("image %s %d bytes, want the PNG's %d", img.MIMEType, len(img.Data), len(raw))
		}
	}
}

func TestExecutionResultError(t *testing.T) {
	for _, e := range []client.ExecutionError{
		{Name: "NameError", Value: "name 'y' is not defined", Traceback: "Cell In[2], line 1\n----> 1 y\nNameError: name 'y' is not defined"},
		{Name: "TimeoutError", Value: "execution exceeded the 1 s timeout"},
		{Name: "KernelDied", Value: "the kernel exited"},
	} {
		res := executionResult(&client.Execution{Stdout: "partial\n", Error: &e})
		txt := res.Content[0].(*mcp.TextContent).Text
		if !res.IsError || !strings.HasPrefix(txt, "ERROR: "+e.Name+": "+e.Value) || !strings.Contains(txt, e.Traceback) || !strings.HasSuffix(txt, "[stdout]\npartial") {
			t.Errorf("%s: isError %v, text:\n%s", e.Name, res.IsError, txt)
		}
	}
}

// A huge exception message or result reaches the model as head and tail,
// as a huge stdout does (a 2 MB message came through as 4 MB: it is in the
// value and the traceback both).
func TestExecutionResultBoundsErrorsAndResults(t *testing.T) {
	huge := strings.Repeat("é", 1<<20)
	res := executionResult(&client.Execution{Error: &client.ExecutionError{Name: "ValueError", Value: huge, Traceback: "ValueError: " + huge}})
	if txt := res.Content[0].(*mcp.TextContent).Text; len(txt) > outputHead+outputTail+512 || !strings.HasPrefix(txt, "ERROR: ValueError: éé") || !strings.Contains(txt, "bytes of output left out") {
		t.Errorf("a huge exception: %d bytes of text", len(txt))
	}
	res = executionResult(&client.Execution{Results: []client.Result{{IsMainResult: true, Text: huge}}})
	if txt := res.Content[0].(*mcp.TextContent).Text; len(txt) > outputHead+outputTail+512 || !strings.HasPrefix(txt, "[result] éé") || !strings.HasSuffix(txt, "éé") {
		t.Errorf("a huge result: %d bytes of text", len(txt))
	}
}

func TestExecutionResultEmptyAndBadImage(t *testing.T) {
	if txt := executionResult(&client.Execution{}).Content[0].(*mcp.TextContent).Text; txt != "(no output)" {
		t.Errorf("empty run: %q", txt)
	}
	res := executionResult(&client.Execution{Results: []client.Result{{PNG: "not base64!"}}})
	if len(res.Content) != 1 || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "not attached") {
		t.Errorf("bad PNG: %d blocks", len(res.Content))
	}
}

func TestExecResult(t *testing.T) {
	res := execResult(&client.ExecResult{Stdout: "a\n", ExitCode: 0})
	if txt := res.Content[0].(*mcp.TextContent).Text; res.IsError || txt != "exit code 0\n\n[stdout]\na" {
		t.Errorf("exit 0: isError %v, %q", res.IsError, txt)
	}
	res = execResult(&client.ExecResult{Stderr: "boom", ExitCode: 2, StderrTruncated: true})
	if txt := res.Content[0].(*mcp.TextContent).Text; !res.IsError || txt != "exit code 2\n\n[stderr]\nboom\n(stderr truncated)" {
		t.Errorf("exit 2: isError %v, %q", res.IsError, txt)
	}
	res = execResult(&client.ExecResult{ExitCode: -1, Signal: "SIGKILL", TimedOut: true})
	if txt := res.Content[0].(*mcp.TextContent).Text; !res.IsError || !strings.HasPrefix(txt, "ERROR: timed out") {
		t.Errorf("timeout: isError %v, %q", res.IsError, txt)
	}
}

func TestIsText(t *testing.T) {
	for in, want := range map[string]bool{"héllo\n": true, "": true, "a\x00b": false, "\xff\xfe": false} {
		if got := isText([]byte(in)); got != want {
			t.Errorf("isText(%q) = %v", in, got)
		}
	}
}

// TestExecutionResultChartData checks that a chart's data reaches the text,
// for models that cannot see the image, and is cut when large.
func TestExecutionResultChartData(t *testing.T) {
	b64, _ := pngBase64(t)
	chart := map[string]any{"type": "bar", "elements": []any{map[string]any{"label": "a", "value": 3}}}
	ex := &client.Execution{Results: []client.Result{{PNG: b64, Chart: chart}}}
	txt := executionResult(ex).Content[0].(*mcp.TextContent).Text
	want := "[chart] image/png attached as image 1\n\n[chart data] {\"elements\":[{\"label\":\"a\",\"value\":3}],\"type\":\"bar\"}"
	if txt != want {
		t.Fatalf("text\n%q\nwant\n%q", txt, want)
	}
	big := map[string]any{"type": "line", "elements": []any{map[string]any{"points": make([]int, 10000)}}}
	txt = executionResult(&client.Execution{Results: []client.Result{{PNG: b64, Chart: big}}}).Content[0].(*mcp.TextContent).Text
	if len(txt) > chartLimit+200 || !strings.Contains(txt, "[chart data] (first 8192 of") {
		t.Fatalf("a large chart: %d bytes of text: %.200q", len(txt), txt)
	}
}

// A display whose text/plain only names the object gives the model its
// HTML or Markdown instead; a DataFrame keeps its text.
func TestResultTextOfRichDisplays(t *testing.T) {
	for _, tc := range []struct {
		r    client.Result
		want string
	}{
		{client.Result{Text: "<IPython.core.display.HTML object>", HTML: "<b>hi</b>"}, "<b>hi</b>"},
		{client.Result{Text: "<IPython.core.display.Markdown object>", Markdown: "# Title", HTML: "<h1>Title</h1>"}, "# Title"},
		{client.Result{Text: "<mymod.Thing object at 0x7f3a2b>", JSON: map[string]any{"a": 1.0}}, `{"a":1}`},
		{client.Result{Text: "   a  b\n0  1  3", HTML: "<table>…</table>"}, "   a  b\n0  1  3"},
		{client.Result{Text: "<IPython.core.display.HTML object>"}, "<IPython.core.display.HTML object>"},
	} {
		if got := resultText(tc.r); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.r, got, tc.want)
		}
	}
	long := client.Result{Text: "<IPython.core.display.HTML object>", HTML: strings.Repeat("é", richLimit)}
	if got := resultText(long); len(got) > richLimit+64 || !strings.Contains(got, "(first 8192 of 16384 bytes)") {
		t.Errorf("a long HTML display: %d bytes, ends %q", len(got), got[len(got)-40:])
	}
}

// Output past what a model should read keeps its head and tail with a
// note; the server's own truncation note (advice for HTTP clients) becomes
// the same note.
func TestForModel(t *testing.T) {
	if got := forModel("short\n\n"); got != "short" {
		t.Errorf("short: %q", got)
	}
	long := strings.Repeat("x", outputHead) + strings.Repeat("y", 1000) + strings.Repeat("z", outputTail)
	got := forModel(long)
	if !strings.HasPrefix(got, strings.Repeat("x", outputHead)+"\n[… 1000 bytes of output left out here;") || !strings.HasSuffix(got, strings.Repeat("z", outputTail)) {
		t.Errorf("long: %d bytes, around the cut %q", len(got), got[outputHead-5:outputHead+120])
	}
	cut := "out\n[pandastack: output truncated, 123 more bytes not kept; stream the exec to get all of it (the SDKs: pass on_stdout / onStdout; HTTP: Accept: application/x-ndjson)]\n"
	if got := forModel(cut); strings.Contains(got, "Accept") || !strings.HasSuffix(got, "out\n[… 123 bytes of output left out after this: the output went on; to see them, write the output to a file and read parts of it (head, tail, grep, sed -n)]") {
		t.Errorf("the server's note: %q", got)
	}
}

// allText is every text block of an answer, joined: what a model reads.
func allText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// A cell that displays much (a display in a loop, a chart per column) is
// one bounded answer: its head and tail, a note of what was left out and
// how to see it, and the first images. Each display was cut alone, and
// 300 of them came through as 30 MB of text and 50 images.
func TestExecutionResultBoundsTheWholeAnswer(t *testing.T) {
	b64, _ := pngBase64(t)
	ex := &client.Execution{Stdout: "starting\n"}
	for i := range 300 {
		ex.Results = append(ex.Results, client.Result{Text: fmt.Sprintf("display %d ", i) + strings.Repeat("x", 100_000)})
		if i%6 == 0 {
			ex.Results = append(ex.Results, client.Result{Text: "<Figure size 640x480 with 1 Axes>", PNG: b64, Chart: map[string]any{"type": "line"}})
		}
	}
	ex.Results = append(ex.Results, client.Result{IsMainResult: true, Text: "42"})
	res := executionResult(ex)
	txt := allText(res)
	if len(txt) > outputHead+outputTail+2048 {
		t.Errorf("%d bytes of text, want about %d", len(txt), outputHead+outputTail)
	}
	if !strings.HasPrefix(txt, "starting\n\n[display] display 0 xxx") || !strings.Contains(txt, "[result] 42") {
		t.Errorf("the head (stdout, the first display) or the last result is missing: %.100q … %.300q", txt, txt[max(0, len(txt)-300):])
	}
	if !strings.Contains(txt, "displays") || !strings.Contains(txt, "left out here") || !strings.Contains(txt, "write them to a file") {
		t.Errorf("no note of the displays left out and how to see them:\n%s", noteLines(txt))
	}
	if imgs := len(res.Content) - 1; imgs > maxImages || imgs == 0 {
		t.Errorf("%d images attached, want 1 to %d", imgs, maxImages)
	}
	if !strings.Contains(txt, "42 of 50 charts not attached") {
		t.Errorf("no note of the charts not attached:\n%s", noteLines(txt))
	}
}

// noteLines is the notes in txt of what was left out, for a failure's message.
func noteLines(txt string) string {
	var notes []string
	for _, l := range strings.Split(txt, "\n") {
		if strings.HasPrefix(l, "[") && (strings.Contains(l, "left out") || strings.Contains(l, "not attached")) {
			notes = append(notes, fmt.Sprintf("%.300s", l))
		}
	}
	return strings.Join(notes, "\n")
}

// Large images stop at maxImageBytes in all, however few they are.
func TestExecutionResultBoundsImageBytes(t *testing.T) {
	big := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x89, 'P', 'N', 'G'}, (3<<20)/4)) // 3 MiB each
	ex := &client.Execution{Results: []client.Result{{PNG: big}, {PNG: big}, {PNG: big}}}
	res := executionResult(ex)
	n, size := 0, 0
	for _, c := range res.Content[1:] {
		n++
		size += len(c.(*mcp.ImageContent).Data)
	}
	if size > maxImageBytes || n != 1 {
		t.Errorf("%d images, %d bytes attached; want 1, at most %d bytes", n, size, maxImageBytes)
	}
	if txt := allText(res); !strings.Contains(txt, "2 of 3 charts not attached") {
		t.Errorf("no note of the charts not attached:\n%s", txt)
	}
}

// A text file larger than an answer holds comes back as its head and tail
// with a note saying how to read the rest; base64 still gives all of it.
func TestFileResultBoundsText(t *testing.T) {
	small := []byte("héllo\n")
	if got := allText(fileResult("/tmp/a.txt", small, false)); got != string(small) {
		t.Errorf("a small text file: %q", got)
	}
	big := []byte(strings.Repeat("a", outputHead) + strings.Repeat("b", 1<<20) + strings.Repeat("c", outputTail))
	txt := allText(fileResult("/tmp/big.txt", big, false))
	if len(txt) > outputHead+outputTail+512 || !strings.HasPrefix(txt, strings.Repeat("a", outputHead)) || !strings.HasSuffix(txt, strings.Repeat("c", outputTail)) ||
		!strings.Contains(txt, "1048576 bytes of /tmp/big.txt left out here") || !strings.Contains(txt, "base64") {
		t.Errorf("a 1 MiB text file: %d bytes: %s", len(txt), noteLines(txt))
	}
	res := fileResult("/tmp/big.txt", big, true)
	if len(res.Content) != 2 || res.Content[1].(*mcp.TextContent).Text != base64.StdEncoding.EncodeToString(big) {
		t.Errorf("base64 of a big text file: not all of it")
	}
}
