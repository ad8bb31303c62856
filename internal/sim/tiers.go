package sim

import (
	"fmt"
	"time"

	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/tier"
)

// tierFormat is the byte format of a page in the host tier and the remote
// store: every layer's K and V planes as the engine's caches hold them.
func tierFormat(cfg *Config) tier.PageFormat {
	m := &cfg.Model
	return tier.PageFormat{Layout: cfg.KVLayout, DType: m.DType, PageSize: cfg.PageSize,
		NumKVHeads: m.NumKVHeads, HeadDim: m.HeadDim, Layers: m.Layers}
}

// tierCopies runs the tier copies the Manager planned since the last call
// (offloads of evicted or published pages, onloads of prefix hits) on the
// CPU, every layer, and reports them complete.
func (s *Sim) tierCopies() error {
	if s.m == nil { // a hybrid model: no tiers
		return nil
	}
	s.copies = s.m.TierCopies(s.copies[:0])
	if len(s.copies) == 0 {
		return nil
	}
	t := time.Now()
	f := tierFormat(&s.cfg)
	plane := f.PlaneBytes()
	s.copyIDs = s.copyIDs[:0]
	for _, c := range s.copies {
		hp := s.m.HostPage(c.Host)
		for l := range s.eng.caches {
			off := f.LayerOffset(l)
			var err error
			// On a device backend the page crosses the host/device
			// boundary through the engine's host mirror of the layer.
			dev := s.eng.dev
			page := []int32{int32(c.Device)}
			if c.Dir == tier.ToHost {
				if dev != nil {
					err = dev.tierTransfer(func() error { return dev.b.DownloadPages(&s.eng.caches[l], dev.caches[l], page) })
				}
				if err == nil {
					err = cpu.CopyPageToHost(hp[off:off+2*plane], &s.eng.caches[l], int(c.Device))
				}
			} else {
				err = cpu.CopyPageFromHost(&s.eng.caches[l], int(c.Device), hp[off:off+2*plane])
				if err == nil && dev != nil {
					err = dev.tierTransfer(func() error { return dev.b.UploadPages(dev.caches[l], &s.eng.caches[l], page) })
				}
			}
			if err != nil {
				return fmt.Errorf("tier copy %d (%v, page %d, host page %d), layer %d: %w", c.ID, c.Dir, c.Device, c.Host, l, err)
			}
		}
		s.copyIDs = append(s.copyIDs, c.ID)
	}
	s.sum.Time.TierCopies += time.Since(t)
	err := s.timed(func() error { return s.m.CompleteTierCopies(s.copyIDs...) })
	if err != nil {
		return fmt.Errorf("complete tier copies: %w", err)
	}
	return nil
}
