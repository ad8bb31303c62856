package replay

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// formatUsage writes every run's cache reads (by medium) and writes in
// tokens: what a provider would bill as cache reads and writes over the
// trace (Result.Usage; docs/cache-usage.md).
func (sw *Sweep) formatUsage(w io.Writer) {
	fmt.Fprintf(w, "\ncache usage (tokens read at every admission, by medium, and written):\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "capacity\tpolicy\tread\tdevice\thost\tdisk\tremote\twritten\t")
	for _, pt := range sw.Points {
		for _, r := range pt.Results {
			u := &r.Usage
			fmt.Fprintf(tw, "%.0f%%\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t\n", 100*pt.Fraction, r.Label(),
				u.ReadTokens(), u.DeviceReadTokens, u.HostReadTokens, u.DiskReadTokens, u.RemoteReadTokens, u.WriteTokens)
		}
	}
	tw.Flush()
}
