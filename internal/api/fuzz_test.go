package api

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pandastack/pandastack"
)

// FuzzDecodeBody: whatever a client sends as a JSON body, decode either
// fills the request type or refuses with invalid_request (or
// payload_too_large), never anything a client would see as a server fault;
// and what it accepts is empty or one JSON object.
func FuzzDecodeBody(f *testing.F) {
	for _, s := range []string{"", "{}", "null", "[]", `"x"`, "1", `{"template":"base","ttl_seconds":60}`, `{"ttl_seconds":"ten"}`, `{"ttl":1}`, `{"cmd":"x"} {}`, `{"env":{"A":"b"}}`, `{"code":null}`, " \n{}", "{\"a\":1e999}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, v := range []any{&createSandboxRequest{}, &execRequest{}, &runRequest{}, &createContextRequest{}} {
			err := decode(httptest.NewRequest("POST", "/", bytes.NewReader(body)), v)
			if err != nil {
				if c := pandastack.ErrorCode(err); c != pandastack.EInvalid && c != pandastack.ETooLarge {
					t.Fatalf("decode(%q) = %v: code %s", body, err, c)
				}
				continue
			}
			if trimmed := bytes.TrimLeft(body, " \t\r\n"); len(trimmed) > 0 && trimmed[0] != '{' {
				t.Fatalf("decode accepted %q, which is not a JSON object", body)
			}
		}
	})
}

// TestBodiless: a POST that takes nothing in its body runs with an empty
// body or {} and refuses anything else with invalid_request, unrun.
func TestBodiless(t *testing.T) {
	for body, want := range map[string]int{"": 204, "{}": 204, " {} ": 204, "garbage{": 400, `{"force":true}`: 400, "[]": 400, "null": 400, "{} {}": 400} {
		ran := false
		h := bodiless(func(w http.ResponseWriter, r *http.Request, project string) {
			ran = true
			w.WriteHeader(http.StatusNoContent)
		})
		rec := httptest.NewRecorder()
		h(rec, httptest.NewRequest("POST", "/v1/sandboxes/x/pause", strings.NewReader(body)), "prj")
		if rec.Code != want || ran != (want == 204) {
			t.Errorf("body %q: %d, ran %v; want %d", body, rec.Code, ran, want)
		}
		if want == 400 && !strings.Contains(rec.Body.String(), `"invalid_request"`) {
			t.Errorf("body %q: %s", body, rec.Body)
		}
	}
}

// TestDecodeMessages: a body of the wrong shape is refused with a message
// in the API's terms (JSON objects, not Go's structs), naming the field.
func TestDecodeMessages(t *testing.T) {
	for body, want := range map[string]string{
		`{"network":[]}`:                          `field "network" must be a JSON object, got array`,
		`{"metadata":{"a":1}}`:                    `must be an object whose values are strings, got number`,
		`{"metadata":{"a":"x","b":null}}`:         `field "metadata" must be an object whose values are strings, got null for "b"`,
		`{"env":{"A":null}}`:                      `field "env" must be an object whose values are strings, got null for "A"`,
		`{"Metadata":{"a":null}}`:                 `field "metadata" must be an object whose values are strings, got null for "a"`,
		`{"metadata":5}`:                          `field "metadata" must be an object whose values are strings, got number`,
		`{"env":{"A":true}}`:                      `must be an object whose values are strings, got bool`,
		`{"ttl_seconds":99999999999999999999999}`: `field "ttl_seconds" is out of range: 99999999999999999999999`,
		`{"cpu":-99999999999999999999}`:           `field "cpu" is out of range: -99999999999999999999`,
		`{"cpu":1.5}`:                             `field "cpu" must be an integer, got number 1.5`,
		`{"template":3}`:                          `field "template" must be a string, got number`,
		`{"template":"base"} x`:                   `data after the JSON object`,
		`{}}`:                                     `data after the JSON object`,
		`{"template":"base"}]`:                    `data after the JSON object`,
		`{} {}`:                                   `data after the JSON object`,
	} {
		err := decode(httptest.NewRequest("POST", "/", strings.NewReader(body)), &createSandboxRequest{})
		if !pandastack.IsCode(err, pandastack.EInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want %q", body, err, want)
		}
	}
	// A null object of strings is none at all.
	if err := decode(httptest.NewRequest("POST", "/", strings.NewReader(`{"metadata":null,"env":null}`)), &createSandboxRequest{}); err != nil {
		t.Errorf("null metadata and env: %v", err)
	}
	// White space after the object is fine.
	if err := decode(httptest.NewRequest("POST", "/", strings.NewReader("{\"template\":\"base\"} \r\n\t")), &createSandboxRequest{}); err != nil {
		t.Errorf("an object followed by white space: %v", err)
	}
}
