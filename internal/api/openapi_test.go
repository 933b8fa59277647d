package api

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/history"
	"github.com/pandastack/pandastack/internal/streamframe"
)

// openAPIDoc is the part of the OpenAPI document the tests look at.
type openAPIDoc struct {
	OpenAPI string `json:"openapi"`
	Info    struct {
		Description string `json:"description"`
	} `json:"info"`
	Paths      map[string]map[string]json.RawMessage `json:"paths"`
	Components struct {
		Schemas map[string]struct {
			Properties map[string]struct {
				Enum []string `json:"enum"`
			} `json:"properties"`
		} `json:"schemas"`
	} `json:"components"`
}

var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

func loadOpenAPI(t *testing.T) openAPIDoc {
	t.Helper()
	var doc openAPIDoc
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatalf("openapi.json is not valid JSON: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1.") {
		t.Fatalf("openapi.json declares openapi %q, want 3.1.x", doc.OpenAPI)
	}
	return doc
}

// docRoutes returns the document's operations as mux patterns, "GET /v1/x/{id}".
func docRoutes(doc openAPIDoc) []string {
	var out []string
	for path, item := range doc.Paths {
		for key := range item {
			if slices.Contains(httpMethods, key) {
				out = append(out, strings.ToUpper(key)+" "+path)
			}
		}
	}
	slices.Sort(out)
	return out
}

// sourceRoutes returns every pattern the package's non-test source registers
// on the mux: the string literal passed to <x>.mux.HandleFunc / Handle, or to
// a helper (such as routes()'s auth) that passes its first parameter on to
// them. A registration whose pattern is anything else fails the test, so a
// route cannot slip past this check.
func sourceRoutes(t *testing.T) []string {
	t.Helper()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}

	// Pass 1: find helpers, and the mux calls inside them that forward the
	// helper's pattern parameter.
	helpers := map[string]bool{}
	forwarding := map[token.Pos]bool{}
	findHelper := func(name string, typ *ast.FuncType, body *ast.BlockStmt) {
		if body == nil || typ.Params == nil || len(typ.Params.List) == 0 || len(typ.Params.List[0].Names) == 0 {
			return
		}
		param := typ.Params.List[0].Names[0].Name
		ast.Inspect(body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if ok && len(call.Args) > 0 && isMuxRegistration(call.Fun) {
				if id, ok := call.Args[0].(*ast.Ident); ok && id.Name == param {
					helpers[name] = true
					forwarding[call.Pos()] = true
				}
			}
			return true
		})
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				findHelper(n.Name.Name, n.Type, n.Body)
			case *ast.AssignStmt:
				for i, rhs := range n.Rhs {
					if lit, ok := rhs.(*ast.FuncLit); ok && i < len(n.Lhs) {
						if id, ok := n.Lhs[i].(*ast.Ident); ok {
							findHelper(id.Name, lit.Type, lit.Body)
						}
					}
				}
			}
			return true
		})
	}

	// Pass 2: collect the patterns of every registration.
	var out []string
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 || forwarding[call.Pos()] {
				return true
			}
			if !isMuxRegistration(call.Fun) && !helpers[calleeName(call.Fun)] {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				t.Errorf("%s: route registered with a pattern that is not a string literal; this test cannot check it", fset.Position(call.Pos()))
				return true
			}
			p, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, p)
			return true
		})
	}
	slices.Sort(out)
	return out
}

// isMuxRegistration reports whether fun is <x>.mux.HandleFunc or <x>.mux.Handle.
func isMuxRegistration(fun ast.Expr) bool {
	f, ok := fun.(*ast.SelectorExpr)
	if !ok || (f.Sel.Name != "HandleFunc" && f.Sel.Name != "Handle") {
		return false
	}
	inner, ok := f.X.(*ast.SelectorExpr)
	return ok && inner.Sel.Name == "mux"
}

// calleeName returns the name of a called function or method.
func calleeName(fun ast.Expr) string {
	switch f := fun.(type) {
	case *ast.Ident:
		return f.Name
	case *ast.SelectorExpr:
		return f.Sel.Name
	}
	return ""
}

func newTestServer(t *testing.T) *Server {
	t.Helper()
	// New only builds the mux; nothing here touches the manager, store or catalog.
	return New(Config{}, nil, nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

var pathParamRE = regexp.MustCompile(`\{[^}]+\}`)

// TestOpenAPIRoutesMatchServer checks that the document and the server
// describe the same routes, in both directions.
func TestOpenAPIRoutesMatchServer(t *testing.T) {
	doc := loadOpenAPI(t)
	s := newTestServer(t)
	documented := docRoutes(doc)
	registered := sourceRoutes(t)
	if len(registered) == 0 {
		t.Fatal("found no route registrations in the package source; has routes() changed shape?")
	}

	// Document → server: each operation must land on the mux pattern of
	// the same method and path.
	for _, route := range documented {
		method, path, _ := strings.Cut(route, " ")
		req := httptest.NewRequest(method, pathParamRE.ReplaceAllString(path, "x"), nil)
		if _, pattern := s.mux.Handler(req); pattern != route {
			t.Errorf("openapi.json documents %s, but the server routes it to %q", route, pattern)
		}
	}

	// Server → document: each registered route must be documented.
	for _, route := range registered {
		if !slices.Contains(documented, route) {
			t.Errorf("the server registers %q, but openapi.json does not document it", route)
		}
		// And the parse must reflect the real mux, or this direction
		// would check nothing.
		method, path, ok := strings.Cut(route, " ")
		if !ok {
			t.Errorf("route %q has no method; every route must name one", route)
			continue
		}
		req := httptest.NewRequest(method, pathParamRE.ReplaceAllString(path, "x"), nil)
		if _, pattern := s.mux.Handler(req); pattern != route {
			t.Errorf("source registers %q, but the mux answers with pattern %q", route, pattern)
		}
	}
}

// TestOpenAPIErrorCodes checks the document's list of error codes and their
// statuses against the code (statusOf).
func TestOpenAPIErrorCodes(t *testing.T) {
	doc := loadOpenAPI(t)
	want := []string{
		pandastack.EInvalid, pandastack.EUnauthorized, pandastack.ENotFound, pandastack.EConflict,
		pandastack.ETimeout, pandastack.EUnavailable, pandastack.ECommandNotFound, pandastack.ETooLarge,
		pandastack.ETemplateMissing, pandastack.ESnapshotCorrupt, pandastack.EStorage, pandastack.EInternal, "method_not_allowed",
		pandastack.ENetworkDenied, pandastack.EPortClosed, pandastack.EPermission, pandastack.EStopped, pandastack.EMemory,
	}
	slices.Sort(want)
	enum := slices.Clone(doc.Components.Schemas["ErrorDetail"].Properties["code"].Enum)
	slices.Sort(enum)
	if !slices.Equal(enum, want) {
		t.Errorf("ErrorDetail.code enum = %v, want %v", enum, want)
	}

	// The table in info.description: | `code` | status | when |
	row := regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| (\\d{3}) \\|")
	seen := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(doc.Info.Description, -1) {
		code, status := m[1], m[2]
		seen[code] = true
		if got := strconv.Itoa(statusOf(code)); got != status {
			t.Errorf("openapi.json says %s is HTTP %s, statusOf says %s", code, status, got)
		}
	}
	for _, code := range want {
		if !seen[code] {
			t.Errorf("error code %s is missing from the table in info.description", code)
		}
	}
}

// TestOpenAPISchemasMatchTypes checks that the documented JSON objects have
// exactly the fields of the Go types that produce or consume them.
func TestOpenAPISchemasMatchTypes(t *testing.T) {
	doc := loadOpenAPI(t)
	for schema, v := range map[string]any{
		"CreateSandboxRequest": createSandboxRequest{},
		"ExecRequest":          execRequest{},
		"PatchSandboxRequest":  patchSandboxRequest{},
		"ExecResult":           pandastack.ExecResult{},
		"Execution":            pandastack.Execution{},
		"Result":               pandastack.Result{},
		"ExecutionError":       pandastack.ExecutionError{},
		"Context":              pandastack.CodeContext{},
		"Sandbox":              pandastack.Sandbox{},
		"NetworkPolicy":        pandastack.NetworkPolicy{},
		"EgressEntry":          pandastack.EgressEntry{},
		"FileInfo":             agentproto.FileInfo{},
		"FileEvent":            pandastack.FileEvent{},
		"Process":              agentproto.Process{},
		"TemplateInfo":         TemplateInfo{},
		"HistoryEntry":         history.Entry{},
		"SandboxStats":         SandboxStats{},
		"Origin":               history.Origin{},
		"APIKey":               pandastack.APIKey{},
		"ExecStreamExit":       frameExit{},
	} {
		s, ok := doc.Components.Schemas[schema]
		if !ok {
			t.Errorf("openapi.json has no schema %s", schema)
			continue
		}
		var got []string
		for name := range s.Properties {
			got = append(got, name)
		}
		slices.Sort(got)
		want := jsonFields(reflect.TypeOf(v))
		if !slices.Equal(got, want) {
			t.Errorf("schema %s has properties %v; the Go type has %v", schema, got, want)
		}
	}
}

func jsonFields(typ reflect.Type) []string {
	var out []string
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// TestOpenAPIServed checks that the document is served as written, without a key.
func TestOpenAPIServed(t *testing.T) {
	s := newTestServer(t)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/openapi.json", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /v1/openapi.json: status %d, body %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	onDisk, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rec.Body.Bytes(), onDisk) {
		t.Error("the served document differs from openapi.json")
	}
}

// TestOpenAPIExecStreamMediaType checks that the exec answer documents the
// binary stream under the media type the server negotiates.
func TestOpenAPIExecStreamMediaType(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	var op struct {
		Responses map[string]struct {
			Content map[string]json.RawMessage `json:"content"`
		} `json:"responses"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(doc.Paths["/v1/sandboxes/{id}/exec"]["post"], &op); err != nil {
		t.Fatal(err)
	}
	content := op.Responses["200"].Content
	for _, mt := range []string{"application/json", "application/x-ndjson", streamframe.MediaType} {
		if _, ok := content[mt]; !ok {
			t.Errorf("exec 200 answer does not document %s", mt)
		}
	}
}
