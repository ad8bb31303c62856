package pagedkv

// ReserveSpec is [Manager.Reserve] for a speculative step: request ids[i]
// computes its next ntokens[i] known tokens and then the draft tokens
// drafts[i] (nil or empty for a request without drafts; drafts may be nil
// for none at all). A request with drafts must reach the end of its known
// tokens in this step (ntokens[i] == tokens not yet computed, usually 1:
// the last sampled token). The plan's rows for request b are its
// ntokens[b] known tokens then its drafts ([Plan.Drafts]); until the step
// is committed or aborted, [Manager.Tokens] ends with the drafts. Commit
// the step with [Manager.CommitSpec]. All-or-nothing like Reserve.
func (m *Manager) ReserveSpec(ids []RequestID, ntokens []int32, drafts [][]int32) (*Plan, error) {
	p, err := m.core.reserve(ids, ntokens, drafts)
	if err != nil {
		return nil, err
	}
	return p.Groups[0], nil
}

// CommitSpec records a step reserved with [Manager.ReserveSpec]:
// accepted[b] (0..drafts of request b) is how many of request b's drafts
// the target model accepted, in order, and sampled is as for
// [Manager.Commit] (the bonus token, appended after the accepted drafts).
// The KV of rejected drafts is rolled back: the request ends exactly as if
// the step had reserved only its known tokens and accepted drafts (see the
// package doc). On error nothing changes and the step stays pending.
func (m *Manager) CommitSpec(accepted, sampled []int32) error {
	return m.core.commitSpec(accepted, sampled)
}

// Truncate cuts request id's tokens to its first n (an engine that edits a
// request: a stop string found late, a rewritten turn). KV past n is
// released: the last page's length shrinks and pages past it go back to the
// pool, or stay cached if they were published. Pages that hold tokens
// before n stay in the prefix cache, so a later prompt (or this request,
// growing again) may reuse them. For a running request under a sliding
// window, n must not be before the first token still on a page
// ([Manager.Pages]); Preempt and Resume to recompute further back. A
// preempted request just loses its tokens past n.
func (m *Manager) Truncate(id RequestID, n int) error { return m.core.truncate(id, n) }
