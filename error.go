// Package pandastack holds the domain types of PandaStack (sandboxes, templates,
// API keys), the interfaces that adapters implement (Store, Runtime) and the
// error codes every layer shares. It imports only the standard library; any
// package in the module may import it.
package pandastack

import (
	"errors"
	"fmt"
	"net/http"
)

// Stable error codes. Clients switch on these; never rename one.
const (
	EInvalid         = "invalid_request"      // the request is malformed or a value is out of range
	EUnauthorized    = "unauthorized"         // missing, unknown or revoked API key
	EPermission      = "permission_denied"    // the sandbox user may not read or write that file (or the filesystem is read-only), or run that program
	ENotFound        = "not_found"            // no such resource in the caller's project
	EConflict        = "conflict"             // the resource is in a state that forbids the operation
	ETimeout         = "timeout"              // the operation ran past its deadline
	EUnavailable     = "sandbox_unavailable"  // the sandbox's agent does not answer for now (starting, dying), or the server is shutting down or its database unreachable: retry
	EStopped         = "sandbox_stopped"      // the sandbox has stopped (killed, expired, out of memory, lost) and never runs again: create a new one
	ECommandNotFound = "command_not_found"    // exec of an argv whose program does not exist
	ETooLarge        = "payload_too_large"    // a request body over the server's limit
	ETemplateMissing = "template_not_built"   // the template exists but has no built root filesystem
	ESnapshotCorrupt = "snapshot_corrupt"     // a snapshot's files are missing, truncated or altered
	EStorage         = "insufficient_storage" // the server's disk is full
	EMemory          = "insufficient_memory"  // the host is short of memory for another running sandbox, and no quiet one was left to suspend: retry later, or pause or kill some
	EInternal        = "internal"             // a bug or a host failure; the message is safe to show
	EMethod          = "method_not_allowed"   // the path exists, the HTTP method does not
	ENetworkDenied   = "network_denied"       // a network rule names a destination in the platform deny set
	EPortClosed      = "port_unreachable"     // nothing answers on the sandbox port a request was proxied to
)

// CloseSandboxStopped is the WebSocket close code of a terminal whose
// sandbox stopped under it: 4000 plus the HTTP status of EStopped; the
// close reason is the error's message.
const CloseSandboxStopped = 4410

// Error is the one error type whose code and message reach API clients.
// Anything else that reaches the API is reported as EInternal with a generic
// message, so host details never leak to users.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Errorf returns an *Error with the given code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the first *Error in err's chain, or EInternal.
func ErrorCode(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return EInternal
}

// ErrorMessage returns the user-facing message of err: the *Error's message, or
// a generic text for anything else.
func ErrorMessage(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return "internal error; see the server log"
}

// IsCode reports whether err carries the given code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// HTTPStatus maps an error code to its HTTP status: the one place that does,
// for the REST API and the agent's API alike.
func HTTPStatus(code string) int {
	switch code {
	case EInvalid, ECommandNotFound:
		return http.StatusBadRequest
	case EUnauthorized:
		return http.StatusUnauthorized
	case EPermission:
		return http.StatusForbidden
	case ENotFound:
		return http.StatusNotFound
	case EMethod:
		return http.StatusMethodNotAllowed
	case EConflict, ETemplateMissing:
		return http.StatusConflict
	case ETooLarge:
		return http.StatusRequestEntityTooLarge
	case ETimeout:
		return http.StatusGatewayTimeout
	case EPortClosed:
		return http.StatusBadGateway
	case EUnavailable, EMemory:
		return http.StatusServiceUnavailable
	case EStopped:
		return http.StatusGone
	case ESnapshotCorrupt, ENetworkDenied:
		return http.StatusUnprocessableEntity
	case EStorage:
		return http.StatusInsufficientStorage
	default:
		return http.StatusInternalServerError
	}
}
