package jupyter

import (
	"fmt"
	"sort"
	"strings"
)

// JJava, the Java kernel, runs each cell as JShell snippets in its own JVM.
// A JVM cannot change its process environment, and Math.random's generator
// is a private static seeded once: the code below reaches both by
// reflection, which the template's kernelspec allows by opening java.util
// and java.lang to the kernel (--add-opens). Every name it declares is
// local to a block, so nothing lands in the user's namespace.

// javaEnvMap is a statement prefix that binds __e to the JVM's live
// environment map: the map behind System.getenv's unmodifiable view.
const javaEnvMap = `var __f = Class.forName("java.lang.ProcessEnvironment").getDeclaredField("theUnmodifiableEnvironment"); __f.setAccessible(true);
  var __u = __f.get(null); var __g = __u.getClass().getDeclaredField("m"); __g.setAccessible(true);
  @SuppressWarnings("unchecked") var __e = (java.util.Map<String, String>) __g.get(__u);
`

// javaSavedEnv is the system property that holds a run's saved variables
// between the set and the restore code.
const javaSavedEnv = "pandastack.saved-env"

// JavaEnvCode is an Options.EnvCode for JJava: it sets the variables in
// the map System.getenv reads for the run, then puts back each one as it
// was. Processes a cell starts inherit the JVM's real environment, not
// this map; docs/code-and-snapshots.md says so.
func JavaEnvCode(env map[string]string) (set, restore string) {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var kv []string
	for _, k := range keys {
		kv = append(kv, javaString(k), javaString(env[k]))
	}
	set = "try { " + javaEnvMap +
		"  String[] __kv = {" + strings.Join(kv, ", ") + "};\n" +
		"  var __s = new java.util.HashMap<String, String>();\n" +
		"  for (int __i = 0; __i < __kv.length; __i += 2) { __s.put(__kv[__i], __e.get(__kv[__i])); __e.put(__kv[__i], __kv[__i + 1]); }\n" +
		"  System.getProperties().put(\"" + javaSavedEnv + "\", __s);\n" +
		"} catch (ReflectiveOperationException __x) { throw new RuntimeException(__x); }\n"
	restore = "try { " + javaEnvMap +
		"  @SuppressWarnings(\"unchecked\") var __s = (java.util.Map<String, String>) System.getProperties().remove(\"" + javaSavedEnv + "\");\n" +
		"  if (__s != null) for (var __x : __s.entrySet()) { if (__x.getValue() == null) __e.remove(__x.getKey()); else __e.put(__x.getKey(), __x.getValue()); }\n" +
		"} catch (ReflectiveOperationException __x) { throw new RuntimeException(__x); }\n"
	return set, restore
}

// JavaReseedCode is an Options.ReseedCode for JJava: Math.random's shared
// generator gets a seed from the OS's randomness (new Random() and
// SecureRandom instances made later seed themselves afresh anyway).
func JavaReseedCode() string {
	return `try { var __h = Class.forName("java.lang.Math$RandomNumberGeneratorHolder").getDeclaredField("randomNumberGenerator"); __h.setAccessible(true);
  ((java.util.Random) __h.get(null)).setSeed(new java.security.SecureRandom().nextLong());
} catch (ReflectiveOperationException __x) { throw new RuntimeException(__x); }
`
}

// javaString quotes s as a Java string literal. Java turns \uXXXX escapes
// into characters before it parses, so a line break, a quote or a backslash
// is never written as one.
func javaString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		default:
			if r < 0x20 {
				fmt.Fprintf(&b, `\u%04x`, r) // a control character inside the literal
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}
