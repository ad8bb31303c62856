package main

import (
	"strings"
	"testing"
)

//go:noinline
func panicForInternalErrorTest() { panic("boom") }

// A recovered panic's message is the old one-line text, then the stack
// where it was recovered, which still names the panic site.
func TestInternalErrorNamesThePanicSite(t *testing.T) {
	var msg string
	func() {
		defer func() { msg = internalError("pagedkv: internal error", recover()) }()
		panicForInternalErrorTest()
	}()
	first, rest, _ := strings.Cut(msg, "\n")
	if first != "pagedkv: internal error: boom" {
		t.Errorf("first line %q, want %q", first, "pagedkv: internal error: boom")
	}
	if !strings.Contains(rest, "panicForInternalErrorTest") {
		t.Errorf("the stack does not name the panic site:\n%s", msg)
	}
}
