package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pandastack/pandastack/client"
)

// maxDownload bounds download_file: its answer goes into a model's context.
const maxDownload = 8 << 20

// A run_code answer attaches at most maxImages images, maxImageBytes in all.
const (
	maxImages     = 8
	maxImageBytes = 4 << 20
)

type createSandboxIn struct {
	Template   string            `json:"template,omitempty" jsonschema:"template name; default code-interpreter (Python with pandas, numpy, matplotlib, plotly)"`
	TTLSeconds int64             `json:"ttl_seconds,omitempty" jsonschema:"seconds until the sandbox is killed; default: the server's"`
	Metadata   map[string]string `json:"metadata,omitempty" jsonschema:"string labels stored with the sandbox"`
	SnapshotID string            `json:"snapshot_id,omitempty" jsonschema:"restore this snapshot (from the snapshot tool) instead of booting the template; internet and allow_out, if given, replace the snapshot's network policy"`
	Internet   *bool             `json:"internet,omitempty" jsonschema:"whether the sandbox may reach the internet; default: the server's, or false when allow_out is given (then only those are reachable)"`
	AllowOut   []string          `json:"allow_out,omitempty" jsonschema:"IPs, CIDRs, domains or *.domains always reachable, even without internet"`
}

type createSandboxOut struct {
	SandboxID string    `json:"sandbox_id"`
	Template  string    `json:"template"`
	ExpiresAt time.Time `json:"expires_at"`
}

type runCodeIn struct {
	Code           string  `json:"code" jsonschema:"source code to run"`
	Language       string  `json:"language,omitempty" jsonschema:"kernel language; default python"`
	SandboxID      string  `json:"sandbox_id,omitempty" jsonschema:"sandbox to run in; default: this session's sandbox"`
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty" jsonschema:"interrupt the run after this many seconds; default: the server's"`
}

type execIn struct {
	Cmd            string  `json:"cmd" jsonschema:"shell command line, run with bash -c"`
	SandboxID      string  `json:"sandbox_id,omitempty" jsonschema:"sandbox to run in; default: this session's sandbox"`
	Cwd            string  `json:"cwd,omitempty" jsonschema:"working directory; default: the sandbox user's home"`
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds; default: the server's"`
}

type uploadIn struct {
	Path      string `json:"path" jsonschema:"file path in the sandbox; parent directories are created"`
	Content   string `json:"content" jsonschema:"the file's content: text, or base64 when base64 is true"`
	Base64    bool   `json:"base64,omitempty" jsonschema:"content is base64-encoded binary"`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"sandbox to write to; default: this session's sandbox"`
}

type downloadIn struct {
	Path      string `json:"path" jsonschema:"file path in the sandbox"`
	Base64    bool   `json:"base64,omitempty" jsonschema:"return base64 even when the file is text (binary files always come back as base64)"`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"sandbox to read from; default: this session's sandbox"`
}

type snapshotIn struct {
	SandboxID string            `json:"sandbox_id,omitempty" jsonschema:"sandbox to snapshot; default: this session's sandbox"`
	Metadata  map[string]string `json:"metadata,omitempty" jsonschema:"string labels stored with the snapshot"`
}

type snapshotOut struct {
	SnapshotID string `json:"snapshot_id"`
	SandboxID  string `json:"sandbox_id"`
	SizeBytes  int64  `json:"size_bytes"`
}

type listSnapshotsIn struct {
	Metadata map[string]string `json:"metadata,omitempty" jsonschema:"only snapshots whose metadata has all these pairs"`
}

type snapshotInfo struct {
	SnapshotID string            `json:"snapshot_id"`
	SandboxID  string            `json:"sandbox_id"`
	Template   string            `json:"template"`
	SizeBytes  int64             `json:"size_bytes"`
	CreatedAt  string            `json:"created_at"`
	Metadata   map[string]string `json:"metadata,omitempty"`
}

type listSnapshotsOut struct {
	Snapshots  []snapshotInfo `json:"snapshots"`
	TotalBytes int64          `json:"total_bytes"`
}

type deleteSnapshotIn struct {
	SnapshotID string `json:"snapshot_id" jsonschema:"the snapshot to delete (snap_…)"`
}

type killProcessesIn struct {
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"sandbox whose processes to end; default: this session's sandbox"`
}

type killIn struct {
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"sandbox to kill; default: this session's sandbox (the next call makes a new one)"`
}

func (s *session) addTools(srv *mcp.Server) {
	addTool(srv, s, &mcp.Tool{
		Name:        "create_sandbox",
		Description: "Create a new sandbox (or restore a snapshot) and return its id. Pass the id as sandbox_id to the other tools. It runs until kill_sandbox or its TTL; this session's own sandbox needs no create_sandbox.",
	}, s.createSandbox)
	addTool(srv, s, &mcp.Tool{
		Name: "run_code",
		Description: "Run code in a Jupyter kernel in the sandbox. Variables and imports persist between calls, like a notebook. " +
			"Returns stdout, stderr and the last expression's value as text, and each chart (matplotlib plt.show(), plotly fig.show()) as a PNG image, with a matplotlib chart's data (type, axes, plotted values) as JSON text. " +
			"An exception, a timeout or a dead kernel sets isError and the text starts with ERROR: and the traceback. " +
			fmt.Sprintf("An answer holds at most %d KiB of text (past that, its head and tail, with a note of what was left out) and the first %d images (%d MiB in all): write large output to a file and read parts of it.", answerLimit>>10, maxImages, maxImageBytes>>20),
	}, s.runCode)
	addTool(srv, s, &mcp.Tool{
		Name:        "exec",
		Description: "Run a shell command in the sandbox and wait for it. Returns the exit code, stdout and stderr; a non-zero exit or a timeout sets isError.",
	}, s.exec)
	addTool(srv, s, &mcp.Tool{
		Name:        "upload_file",
		Description: "Write a file in the sandbox from text, or from base64 for binary content.",
	}, s.uploadFile)
	addTool(srv, s, &mcp.Tool{
		Name:        "download_file",
		Description: fmt.Sprintf("Read a file from the sandbox (at most %d MiB): text (UTF-8) comes back as text, its head and tail with a note when longer than %d KiB; anything else, or any file with base64 true, as a line saying it is base64, then the base64 of all of it.", maxDownload>>20, answerLimit>>10),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, s.downloadFile)
	addTool(srv, s, &mcp.Tool{
		Name:        "snapshot",
		Description: "Save the sandbox's memory, processes and files as a snapshot and return its id; the sandbox keeps running. create_sandbox with snapshot_id brings it back, kernel state included.",
	}, s.snapshot)
	addTool(srv, s, &mcp.Tool{
		Name:        "list_snapshots",
		Description: "List this project's snapshots, newest first, with the sandbox each was taken of, its size and metadata; metadata filters them.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, s.listSnapshots)
	addTool(srv, s, &mcp.Tool{
		Name:        "delete_snapshot",
		Description: "Delete a snapshot and free its disk. Sandboxes restored from it are not affected.",
	}, s.deleteSnapshot)
	addTool(srv, s, &mcp.Tool{
		Name: "kill_processes",
		Description: "End every process in the sandbox but the run_code kernels, which keep their variables: commands left running in the background, servers, a fork bomb. " +
			"Use it when exec fails because the sandbox has too many processes, or to stop what earlier commands left behind. Files stay.",
	}, s.killProcesses)
	addTool(srv, s, &mcp.Tool{
		Name:        "kill_sandbox",
		Description: "Kill a sandbox. Without sandbox_id, kills this session's sandbox; the next call then starts a fresh one.",
	}, s.killSandbox)
}

// addTool adds a tool of s whose errors go through Config.Explain.
func addTool[In, Out any](srv *mcp.Server, s *session, t *mcp.Tool, h mcp.ToolHandlerFor[In, Out]) {
	mcp.AddTool(srv, t, func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		res, out, err := h(ctx, req, in)
		if err != nil && s.cfg.Explain != nil {
			err = s.cfg.Explain(err)
		}
		return res, out, err
	})
}

func text(format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}}}
}

func (s *session) createSandbox(ctx context.Context, _ *mcp.CallToolRequest, in createSandboxIn) (*mcp.CallToolResult, createSandboxOut, error) {
	var sb *client.Sandbox
	var err error
	// A policy asked for applies to a restore too (the snapshot's own is
	// kept only when none is asked for): one dropped would leave the
	// restored sandbox as open as its snapshot, unknown to the model.
	var network *client.NetworkPolicy
	if in.Internet != nil || len(in.AllowOut) > 0 {
		// As in the API: without internet, only allow_out is reachable.
		p := client.NetworkPolicy{AllowInternetAccess: in.Internet != nil && *in.Internet, AllowOut: in.AllowOut}
		p = p.Normalized()
		network = &p
	}
	if in.SnapshotID != "" {
		if in.Template != "" {
			return nil, createSandboxOut{}, errors.New("give template or snapshot_id, not both: a restored sandbox has its snapshot's template")
		}
		sb, err = s.c.CreateSandboxFromSnapshot(ctx, client.RestoreRequest{SnapshotID: in.SnapshotID, TTLSeconds: in.TTLSeconds, Metadata: in.Metadata, Network: network})
	} else {
		tpl := in.Template
		if tpl == "" {
			tpl = s.cfg.Template
		}
		sb, err = s.c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: tpl, TTLSeconds: in.TTLSeconds, Metadata: in.Metadata, Network: network})
	}
	if err != nil {
		return nil, createSandboxOut{}, err
	}
	s.log.Info("sandbox created", "sandbox", sb.ID, "template", sb.Template)
	out := createSandboxOut{SandboxID: sb.ID, Template: sb.Template, ExpiresAt: sb.ExpiresAt}
	return text("%s", sb.ID), out, nil
}

func (s *session) runCode(ctx context.Context, _ *mcp.CallToolRequest, in runCodeIn) (*mcp.CallToolResult, any, error) {
	res, err := s.onSandbox(ctx, in.SandboxID, func(id string) (*mcp.CallToolResult, error) {
		lang := strings.ToLower(in.Language)
		if lang == "" {
			lang = "python"
		}
		release, err := s.turn(ctx, id+"/"+lang)
		if err != nil {
			return nil, err
		}
		defer release()
		ex, err := s.c.RunCode(ctx, id, client.RunRequest{Code: in.Code, Language: strings.ToLower(in.Language), TimeoutSeconds: in.TimeoutSeconds})
		if err != nil {
			return nil, err
		}
		return executionResult(ex), nil
	})
	return res, nil, err
}

// executionResult turns an Execution into one text block (the error and
// traceback first, so a model reads them before anything else) and one
// image block per chart. Each part is cut alone, and the whole answer
// again, to answerLimit of text and maxImages images: a display in a
// loop, or a chart per column, would otherwise put megabytes into the
// model's context, which clients refuse or drop.
func executionResult(ex *client.Execution) *mcp.CallToolResult {
	var parts []part
	add := func(kind, header, s string) {
		parts = append(parts, part{kind: kind, text: header + forModel(s), size: len(s)})
	}
	if e := ex.Error; e != nil {
		msg := "ERROR: " + e.Name
		if e.Value != "" {
			msg += ": " + e.Value
		}
		if tb := strings.TrimSpace(e.Traceback); tb != "" {
			msg += "\n" + tb
		}
		add("error", "", msg) // an exception's message can be megabytes too
	}
	if ex.Stdout != "" {
		if len(parts) > 0 {
			add("stdout", "[stdout]\n", ex.Stdout)
		} else {
			add("stdout", "", ex.Stdout)
		}
	}
	if ex.Stderr != "" {
		add("stderr", "[stderr]\n", ex.Stderr)
	}
	var images []mcp.Content
	charts, imageBytes, dropped := 0, 0, 0
	for _, r := range ex.Results {
		img, mime, err := resultImage(r)
		switch {
		case err != nil:
			parts = append(parts, part{kind: "chart", text: fmt.Sprintf("[chart] not attached: %v", err)})
		case img != nil:
			charts++
			// The first ones, in order: once one does not fit, none after it
			// is attached, so that "the first n" is what the model gets.
			var line string
			if dropped == 0 && len(images) < maxImages && imageBytes+len(img) <= maxImageBytes {
				images = append(images, &mcp.ImageContent{Data: img, MIMEType: mime})
				imageBytes += len(img)
				line = fmt.Sprintf("[chart] %s attached as image %d", mime, len(images))
			} else {
				dropped++
				line = fmt.Sprintf("[chart] %s not attached (see the note at the end)", mime)
			}
			size := len(img)
			if r.Chart != nil {
				line += "\n\n" + chartText(r.Chart)
			}
			parts = append(parts, part{kind: "chart", text: line, size: size})
		case r.IsMainResult && resultText(r) != "":
			add("result", "[result] ", resultText(r))
		case resultText(r) != "":
			add("display", "[display] ", resultText(r))
		}
	}
	txt := "(no output)"
	if len(parts) > 0 {
		txt = joinBounded(parts)
	}
	if dropped > 0 {
		txt += fmt.Sprintf("\n\n[%d of %d charts not attached: an answer holds the first %d images, %d MiB in all; show fewer per run (subplots in one figure, or one run per chart), or save them to files (plt.savefig) and display the ones to look at in later runs]",
			dropped, charts, maxImages, maxImageBytes>>20)
	}
	res := &mcp.CallToolResult{Content: append([]mcp.Content{&mcp.TextContent{Text: txt}}, images...)}
	res.IsError = ex.Error != nil
	return res
}

// answerLimit bounds the text of a run_code answer, all its parts
// together, and of a text file download_file returns: what one stream of
// an exec gets.
const answerLimit = outputHead + outputTail

// A part is one item of a run's answer: its text for the model, what
// kind it is and how many bytes of output it stood for, for the note of
// what was left out.
type part struct {
	kind string // error, stdout, stderr, result, display or chart
	text string
	size int
}

// joinBounded joins parts; past answerLimit (and a little more, for the
// note of one part cut alone), it keeps the head and tail of them all,
// with a note of which parts were left out, whole or in part.
func joinBounded(parts []part) string {
	texts := make([]string, len(parts))
	total := 0
	for i, p := range parts {
		texts[i] = p.text
		total += p.size
	}
	const sep = "\n\n"
	s := strings.Join(texts, sep)
	if len(s) <= answerLimit+1<<10 {
		return s
	}
	return headTail(s, func(head, tail int) string {
		var kinds []string
		counts := map[string]int{}
		off := 0
		for _, p := range parts {
			start, end := off, off+len(p.text)
			off = end + len(sep)
			if end > head && start < len(s)-tail {
				if counts[p.kind] == 0 {
					kinds = append(kinds, p.kind)
				}
				counts[p.kind]++
			}
		}
		var out []string
		for _, k := range kinds {
			switch n := counts[k]; k {
			case "display", "chart":
				if n == 1 {
					out = append(out, "1 "+k)
				} else {
					out = append(out, fmt.Sprintf("%d %ss", n, k))
				}
			case "error", "result":
				out = append(out, "the "+k)
			default:
				out = append(out, k)
			}
		}
		return fmt.Sprintf("[… %d bytes left out here, of %s (whole or in part): the run gave %d bytes of output, and an answer holds %d KiB of text; to see them, write them to a file in the code and read parts of it with exec (head, tail, grep, sed -n)]",
			len(s)-head-tail, joinAnd(out), total, answerLimit>>10)
	})
}

// joinAnd joins items as a list in a sentence: "a", "a and b", "a, b and c".
func joinAnd(items []string) string {
	if len(items) <= 1 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

// headTail returns s's first outputHead and last outputTail bytes, on
// character boundaries, with note(len(head), len(tail)) on a line between.
func headTail(s string, note func(head, tail int) string) string {
	head := truncUTF8(s, outputHead)
	tail := s[len(s)-outputTail:]
	for len(tail) > 0 && !utf8.RuneStart(tail[0]) {
		tail = tail[1:]
	}
	return head + "\n" + note(len(head), len(tail)) + "\n" + tail
}

// reprRE matches the text/plain of an object that has no text of its own,
// such as IPython's HTML or Markdown displays.
var reprRE = regexp.MustCompile(`^<[\w.]+ object(?: at 0x[0-9a-f]+)?>$`)

// richLimit bounds the HTML, Markdown, LaTeX or JSON put into the text in
// place of a result's empty text/plain.
const richLimit = 8 << 10

// resultText is what a model reads of a result: its text/plain, or, when
// that only names the object ("<IPython.core.display.HTML object>"), its
// Markdown, HTML, LaTeX or JSON, at most richLimit bytes.
func resultText(r client.Result) string {
	if !reprRE.MatchString(strings.TrimSpace(r.Text)) {
		return r.Text
	}
	rich := ""
	switch {
	case r.Markdown != "":
		rich = r.Markdown
	case r.HTML != "":
		rich = r.HTML
	case r.LaTeX != "":
		rich = r.LaTeX
	case r.JSON != nil:
		if b, err := json.Marshal(r.JSON); err == nil {
			rich = string(b)
		}
	}
	if rich == "" {
		return r.Text
	}
	if len(rich) > richLimit {
		rich = fmt.Sprintf("%s… (first %d of %d bytes)", truncUTF8(rich, richLimit), richLimit, len(rich))
	}
	return rich
}

// outputLimit bounds each stream of a run or an exec in a tool's answer,
// which goes into a model's context: its head and tail are kept.
const (
	outputHead = 96 << 10
	outputTail = 32 << 10
)

// serverCut is the note the server ends an exec's output with when it kept
// only its first part; its advice (stream the exec) is not for a model.
var serverCut = regexp.MustCompile(`\n\[pandastack: output truncated, (\d+) more bytes not kept; [^\]]*\]\n$`)

// forModel is a stream's text for a model: without trailing newlines, and
// when longer than outputHead+outputTail, its head and tail with a note of
// what was left out and how to see it. Output the server already cut (it
// keeps an exec's first part) ends with a note that it went on.
func forModel(s string) string {
	lost := 0
	if m := serverCut.FindStringSubmatchIndex(s); m != nil {
		lost, _ = strconv.Atoi(s[m[2]:m[3]])
		s = s[:m[0]]
	}
	s = strings.TrimRight(s, "\n")
	if len(s) > answerLimit {
		s = headTail(s, func(head, tail int) string { return cutNote(len(s)-head-tail, "here") })
	}
	if lost > 0 {
		s += "\n" + cutNote(lost, "after this: the output went on")
	}
	return s
}

func cutNote(omitted int, where string) string {
	return fmt.Sprintf("[… %d bytes of output left out %s; to see them, write the output to a file and read parts of it (head, tail, grep, sed -n)]", omitted, where)
}

// truncUTF8 returns the longest prefix of s of at most n bytes that ends
// on a character boundary.
func truncUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// chartLimit bounds the chart data put into the text, for a model that
// cannot see the image: its type, axes and the first elements' data.
const chartLimit = 8 << 10

func chartText(chart map[string]any) string {
	b, err := json.Marshal(chart)
	if err != nil {
		return "[chart data] unreadable: " + err.Error()
	}
	if len(b) > chartLimit {
		return fmt.Sprintf("[chart data] (first %d of %d bytes) %s…", chartLimit, len(b), b[:chartLimit])
	}
	return "[chart data] " + string(b)
}

// resultImage returns the decoded chart of a result: its PNG, else its
// JPEG; nil when it has neither.
func resultImage(r client.Result) ([]byte, string, error) {
	data, mime := r.PNG, "image/png"
	if data == "" {
		data, mime = r.JPEG, "image/jpeg"
	}
	if data == "" {
		return nil, "", nil
	}
	// Jupyter may wrap base64 in lines.
	b, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(data), ""))
	if err != nil {
		return nil, "", fmt.Errorf("bad base64 %s: %w", mime, err)
	}
	return b, mime, nil
}

func (s *session) exec(ctx context.Context, _ *mcp.CallToolRequest, in execIn) (*mcp.CallToolResult, any, error) {
	if strings.TrimSpace(in.Cmd) == "" {
		return nil, nil, errors.New("cmd is empty")
	}
	res, err := s.onSandbox(ctx, in.SandboxID, func(id string) (*mcp.CallToolResult, error) {
		r, err := s.c.Exec(ctx, id, client.ExecRequest{Cmd: in.Cmd, Cwd: in.Cwd, TimeoutSeconds: in.TimeoutSeconds})
		if err != nil {
			return nil, err
		}
		return execResult(r), nil
	})
	return res, nil, err
}

func execResult(r *client.ExecResult) *mcp.CallToolResult {
	status := fmt.Sprintf("exit code %d", r.ExitCode)
	if r.Signal != "" {
		status += ", killed by " + r.Signal
	}
	if r.TimedOut {
		status = "ERROR: timed out (" + status + ")"
	}
	parts := []string{status}
	add := func(name, s string, truncated bool) {
		if s == "" {
			return
		}
		s = "[" + name + "]\n" + forModel(s)
		if truncated && !strings.Contains(s, "bytes of output left out") {
			s += "\n(" + name + " truncated)"
		}
		parts = append(parts, s)
	}
	add("stdout", r.Stdout, r.StdoutTruncated)
	add("stderr", r.Stderr, r.StderrTruncated)
	res := text("%s", strings.Join(parts, "\n\n"))
	res.IsError = r.ExitCode != 0 || r.TimedOut
	return res
}

func (s *session) uploadFile(ctx context.Context, _ *mcp.CallToolRequest, in uploadIn) (*mcp.CallToolResult, any, error) {
	data := []byte(in.Content)
	if in.Base64 {
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, nil, fmt.Errorf("content is not valid base64: %w", err)
		}
	}
	res, err := s.onSandbox(ctx, in.SandboxID, func(id string) (*mcp.CallToolResult, error) {
		fi, err := s.c.WriteFile(ctx, id, in.Path, bytes.NewReader(data))
		if err != nil {
			return nil, err
		}
		return text("wrote %d bytes to %s", fi.Size, fi.Path), nil
	})
	return res, nil, err
}

func (s *session) downloadFile(ctx context.Context, _ *mcp.CallToolRequest, in downloadIn) (*mcp.CallToolResult, any, error) {
	res, err := s.onSandbox(ctx, in.SandboxID, func(id string) (*mcp.CallToolResult, error) {
		rc, err := s.c.ReadFile(ctx, id, in.Path)
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		b, err := io.ReadAll(io.LimitReader(rc, maxDownload+1))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", in.Path, err)
		}
		if len(b) > maxDownload {
			return nil, fmt.Errorf("%s is larger than %d MiB; read part of it with exec (head, tail, split)", in.Path, maxDownload>>20)
		}
		return fileResult(in.Path, b, in.Base64), nil
	})
	return res, nil, err
}

// fileResult is download_file's answer for the content b of path.
func fileResult(path string, b []byte, asBase64 bool) *mcp.CallToolResult {
	if !asBase64 && isText(b) {
		if len(b) <= answerLimit {
			return text("%s", b)
		}
		return text("%s", headTail(string(b), func(head, tail int) string {
			return fmt.Sprintf("[… %d bytes of %s left out here: an answer holds %d KiB of a text file; read parts of it with exec (head, tail, grep, sed -n), or all of it (at most %d MiB) with base64 true]",
				len(b)-head-tail, path, answerLimit>>10, maxDownload>>20)
		}))
	}
	// Said apart from the data, so that a model can tell base64 from a
	// file whose text looks like it, and a program can take the last
	// item as it is.
	why := "binary, or text that is not UTF-8"
	if asBase64 {
		why = "as asked"
	}
	return &mcp.CallToolResult{Content: []mcp.Content{
		&mcp.TextContent{Text: fmt.Sprintf("[base64 of the %d bytes of %s (%s); the next item is the data]", len(b), path, why)},
		&mcp.TextContent{Text: base64.StdEncoding.EncodeToString(b)},
	}}
}

// isText reports whether b reads as text: valid UTF-8 without NUL bytes.
func isText(b []byte) bool {
	return utf8.Valid(b) && bytes.IndexByte(b, 0) < 0
}

func (s *session) snapshot(ctx context.Context, _ *mcp.CallToolRequest, in snapshotIn) (*mcp.CallToolResult, snapshotOut, error) {
	var out snapshotOut
	res, err := s.onSandbox(ctx, in.SandboxID, func(id string) (*mcp.CallToolResult, error) {
		snap, err := s.c.CreateSnapshot(ctx, id, in.Metadata)
		if err != nil {
			return nil, err
		}
		out = snapshotOut{SnapshotID: snap.ID, SandboxID: snap.SandboxID, SizeBytes: snap.SizeBytes}
		return text("%s", snap.ID), nil
	})
	return res, out, err
}

func (s *session) listSnapshots(ctx context.Context, _ *mcp.CallToolRequest, in listSnapshotsIn) (*mcp.CallToolResult, listSnapshotsOut, error) {
	snaps, total, err := s.c.ListSnapshots(ctx, in.Metadata)
	if err != nil {
		return nil, listSnapshotsOut{}, err
	}
	// Newest first, as the tool says: the API lists oldest first, and a
	// model reads the first entry as the latest.
	slices.Reverse(snaps)
	out := listSnapshotsOut{Snapshots: []snapshotInfo{}, TotalBytes: total}
	var b strings.Builder
	fmt.Fprintf(&b, "%d snapshot(s), %d MB in all", len(snaps), total/1e6)
	for _, sn := range snaps {
		out.Snapshots = append(out.Snapshots, snapshotInfo{SnapshotID: sn.ID, SandboxID: sn.SandboxID, Template: sn.Template,
			SizeBytes: sn.SizeBytes, CreatedAt: sn.CreatedAt.UTC().Format(time.RFC3339), Metadata: sn.Metadata})
		fmt.Fprintf(&b, "\n%s of %s (%s), %d MB, %s", sn.ID, sn.SandboxID, sn.Template, sn.SizeBytes/1e6, sn.CreatedAt.UTC().Format(time.RFC3339))
		for _, k := range slices.Sorted(maps.Keys(sn.Metadata)) {
			fmt.Fprintf(&b, " %s=%s", k, sn.Metadata[k])
		}
	}
	return text("%s", b.String()), out, nil
}

func (s *session) deleteSnapshot(ctx context.Context, _ *mcp.CallToolRequest, in deleteSnapshotIn) (*mcp.CallToolResult, any, error) {
	if in.SnapshotID == "" {
		return nil, nil, errors.New("give the snapshot_id to delete (list_snapshots shows them)")
	}
	if err := s.c.DeleteSnapshot(ctx, in.SnapshotID); err != nil {
		return nil, nil, err
	}
	s.log.Info("snapshot deleted", "snapshot", in.SnapshotID)
	return text("deleted %s", in.SnapshotID), nil, nil
}

func (s *session) killProcesses(ctx context.Context, _ *mcp.CallToolRequest, in killProcessesIn) (*mcp.CallToolResult, any, error) {
	if in.SandboxID == "" {
		s.mu.Lock()
		own := s.id
		s.mu.Unlock()
		if own == "" {
			return text("this session has no sandbox yet; nothing to end"), nil, nil
		}
	}
	res, err := s.onSandbox(ctx, in.SandboxID, func(id string) (*mcp.CallToolResult, error) {
		k, err := s.c.KillAllProcesses(ctx, id)
		if err != nil {
			return nil, err
		}
		if k.Remaining > 0 {
			return text("killed %s; %d were still forking at the end: call kill_processes again", processes(k.Killed), k.Remaining), nil
		}
		return text("killed %s; the kernels and their variables are kept", processes(k.Killed)), nil
	})
	return res, nil, err
}

// processes says "1 process" or "n processes".
func processes(n int) string {
	if n == 1 {
		return "1 process"
	}
	return fmt.Sprintf("%d processes", n)
}

func (s *session) killSandbox(ctx context.Context, _ *mcp.CallToolRequest, in killIn) (*mcp.CallToolResult, any, error) {
	s.mu.Lock()
	own := s.id
	s.mu.Unlock()
	id := in.SandboxID
	if id == "" {
		if id = own; id == "" {
			return text("this session has no sandbox yet; nothing to kill"), nil, nil
		}
	}
	if err := s.c.KillSandbox(ctx, id); err != nil {
		if !client.IsCode(err, "not_found") || id != own {
			return nil, nil, err
		}
		// The session's sandbox, gone already (killed elsewhere, its TTL):
		// what was asked for is done, and the next call starts a new one.
		s.forget(id)
		return text("%s was already gone; the next call starts a fresh sandbox", id), nil, nil
	}
	s.forget(id)
	s.log.Info("sandbox killed", "sandbox", id)
	return text("killed %s", id), nil, nil
}
