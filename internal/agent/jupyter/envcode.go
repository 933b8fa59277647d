package jupyter

import "encoding/json"

// jsonLiteral is env as a JSON text, quoted as a string literal that
// JavaScript and R read the same: Go escapes only ", \, control characters
// and <, >, & (as \u00XX), never as \/.
func jsonLiteral(env map[string]string) string {
	b, _ := json.Marshal(env)
	lit, _ := json.Marshal(string(b))
	return string(lit)
}

// DenoEnvCode is an Options.EnvCode for Deno's kernel: it saves and sets
// Deno.env for the run, then puts it back, leaving only a global that the
// restore deletes.
func DenoEnvCode(env map[string]string) (set, restore string) {
	set = "{ const e = JSON.parse(" + jsonLiteral(env) + ");\n" +
		"  globalThis.__pandastackSavedEnv = Object.fromEntries(Object.keys(e).map((k) => [k, Deno.env.get(k)]));\n" +
		"  for (const [k, v] of Object.entries(e)) Deno.env.set(k, v); }\n"
	restore = "{ for (const [k, v] of Object.entries(globalThis.__pandastackSavedEnv ?? {})) {\n" +
		"    if (v === undefined) Deno.env.delete(k); else Deno.env.set(k, v);\n" +
		"  }\n" +
		"  delete globalThis.__pandastackSavedEnv; }\n"
	return set, restore
}

// REnvCode is an Options.EnvCode for IRkernel: Sys.setenv for the run, the
// old values kept in an option (not in the user's environment) and put
// back after.
func REnvCode(env map[string]string) (set, restore string) {
	set = "local({ e <- jsonlite::fromJSON(" + jsonLiteral(env) + ")\n" +
		"  options(.pandastack_saved_env = Sys.getenv(names(e), unset = NA, names = TRUE))\n" +
		"  do.call(Sys.setenv, as.list(e)) })\n"
	restore = "local({ s <- getOption(\".pandastack_saved_env\")\n" +
		"  for (k in names(s)) if (is.na(s[[k]])) Sys.unsetenv(k) else do.call(Sys.setenv, setNames(list(s[[k]]), k))\n" +
		"  options(.pandastack_saved_env = NULL) })\n"
	return set, restore
}
