package jupyter

import (
	"os/exec"
	"strings"
	"testing"
)

// jshell runs snippets in a real JShell with the --add-opens the
// template's Java kernelspec gives, and returns what they printed.
func jshell(t *testing.T, snippets ...string) string {
	t.Helper()
	bin, err := exec.LookPath("jshell")
	if err != nil {
		t.Skip("jshell (a JDK) not found; the code-interpreter template has one, and e2e's TestLanguages runs this code there")
	}
	cmd := exec.Command(bin, "--feedback", "silent",
		"-R--add-opens=java.base/java.util=ALL-UNNAMED", "-R--add-opens=java.base/java.lang=ALL-UNNAMED", "-")
	cmd.Stdin = strings.NewReader(strings.Join(snippets, "\n") + "\n/exit\n")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("jshell: %v\n%s%s", err, out, stderr.String())
	}
	return string(out)
}

// TestJavaEnvCode: the variables are what System.getenv answers during the
// run, whatever their characters, and as they were after it.
func TestJavaEnvCode(t *testing.T) {
	env := map[string]string{
		"PANDA_NEW":  "a \"quoted\" \\u0041 \\ é 😀\ttab",
		"PANDA_LINE": "one\ntwo\r\u0001",
		"HOME":       "/elsewhere",
	}
	set, restore := JavaEnvCode(env)
	show := `System.out.println("[" + System.getenv("PANDA_NEW") + "|" + System.getenv("PANDA_LINE") + "|" + System.getenv("HOME") + "]");`
	out := jshell(t, show, set, show, restore, show)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	home := strings.TrimSuffix(strings.TrimPrefix(lines[0], "[null|null|"), "]")
	want := "[null|null|" + home + "]\n[" + env["PANDA_NEW"] + "|" + env["PANDA_LINE"] + "|/elsewhere]\n[null|null|" + home + "]"
	if got := strings.TrimSpace(out); got != want || home == "" {
		t.Fatalf("jshell printed\n%q\nwant\n%q", got, want)
	}
}

// TestJavaReseedCode: after the reseed, Math.random continues differently
// from a copy of the same state, as two restored sandboxes would.
func TestJavaReseedCode(t *testing.T) {
	// The same seed twice stands for two copies of one image.
	seedAndDraw := `((java.util.Random) ((java.util.function.Supplier<Object>) () -> { try { var h = Class.forName("java.lang.Math$RandomNumberGeneratorHolder").getDeclaredField("randomNumberGenerator"); h.setAccessible(true); return h.get(null); } catch (Exception e) { throw new RuntimeException(e); } }).get()).setSeed(42);`
	draw := `System.out.println(Math.random());`
	a := jshell(t, seedAndDraw, draw, seedAndDraw, draw)
	if f := strings.Fields(a); len(f) != 2 || f[0] != f[1] {
		t.Fatalf("the same seed drew %q", a)
	}
	b := jshell(t, seedAndDraw, JavaReseedCode(), draw, seedAndDraw, JavaReseedCode(), draw)
	if f := strings.Fields(b); len(f) != 2 || f[0] == f[1] {
		t.Fatalf("after a reseed each copy should draw its own number: %q", b)
	}
}
