package tokenize

import "time"

// Test hooks: methods only tests use, kept out of the production files.

// withClock returns a copy whose strftime_now reads now (tests use a fixed time).
func (c *ChatTemplate) withClock(now func() time.Time) *ChatTemplate {
	cp := *c
	cp.now = now
	if c.toolUse != nil {
		cp.toolUse = c.toolUse.withClock(now)
	}
	return &cp
}

// checkAccounting recomputes every shard's size from its entries and checks the
// bookkeeping (tests).
func (c *segCache) checkAccounting() (total int64, ok bool) {
	ok = true
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.RLock()
		var sum int64
		live := 0
		for j := range sh.entries {
			e := &sh.entries[j]
			if !e.live {
				continue
			}
			live++
			sum += segEntrySize(len(e.key), len(e.ids))
			if k, in := sh.index[e.hash]; !in || int(k) != j {
				ok = false
			}
		}
		if sum != sh.bytes || sum > sh.budget || live != len(sh.index) || live+len(sh.free) != len(sh.entries) {
			ok = false
		}
		total += sum
		sh.mu.RUnlock()
	}
	return total, ok && total <= c.max
}
