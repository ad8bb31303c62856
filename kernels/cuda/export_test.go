package cuda

// ScheduledItems is the number of work items the split-KV scheduler gave
// the last planned level of s (a fixed step's padding excluded), and
// whether the level merges partial states.
func (s *Step) ScheduledItems() (items int, merged bool) {
	if m := s.sched.merge; m != nil {
		return int(m[s.rows]), true
	}
	return s.rows, false
}
