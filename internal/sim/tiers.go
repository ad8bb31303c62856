package sim

import (
	"fmt"
	"time"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/tier"
)

// tierFormat is the byte format of a page in the host tier and the remote
// store: every layer's K and V planes as the engine's caches hold them.
func tierFormat(cfg *Config) tier.PageFormat {
	m := &cfg.Model
	if hasMLA(cfg.Groups) {
		return mlaTierFormat(cfg)
	}
	return tier.PageFormat{Layout: cfg.KVLayout, DType: m.CacheDType(), PageSize: cfg.PageSize,
		NumKVHeads: m.NumKVHeads, HeadDim: m.HeadDim, Layers: m.Layers}
}

// tierCopies runs the tier copies the manager planned since the last call
// (offloads of evicted or published pages, onloads of prefix hits) on the
// CPU, every layer, and reports them complete. A hybrid model's copies
// name pool pages: every layer's planes move, whichever group holds the
// page.
func (s *Sim) tierCopies() error {
	s.copies = s.kv.TierCopies(s.copies[:0])
	if len(s.copies) == 0 {
		return nil
	}
	t := time.Now()
	s.copyIDs = s.copyIDs[:0]
	for _, c := range s.copies {
		var err error
		if c.Dir == tier.ToHost {
			err = s.readPage(s.kv.HostPage(c.Host), c.Device)
		} else if !s.eng.skipOnloads {
			err = s.writePage(c.Device, s.kv.HostPage(c.Host))
		}
		if err != nil {
			return fmt.Errorf("tier copy %d (%v, page %d, host page %d): %w", c.ID, c.Dir, c.Device, c.Host, err)
		}
		s.copyIDs = append(s.copyIDs, c.ID)
	}
	s.sum.Time.TierCopies += time.Since(t)
	err := s.timed(func() error { return s.kv.CompleteTierCopies(s.copyIDs...) })
	if err != nil {
		return fmt.Errorf("complete tier copies: %w", err)
	}
	return nil
}

// readPage copies every layer's K and V planes of device page p into dst
// (tierFormat's bytes). On a device backend the page crosses the
// host/device boundary through the engine's host mirror of the layer.
func (s *Sim) readPage(dst []byte, p pagedkv.PageID) error {
	if me := s.eng.mla; me != nil {
		me.tierPage(tierFormat(&s.cfg), dst, int(p), false)
		return nil
	}
	return s.eachLayer(dst, p, func(l int, planes []byte, page []int32) error {
		if dev := s.eng.dev; dev != nil {
			if err := dev.tierTransfer(func() error { return dev.b.DownloadPages(&s.eng.caches[l], dev.caches[l], page) }); err != nil {
				return err
			}
		}
		return cpu.CopyPageToHost(planes, &s.eng.caches[l], int(p))
	})
}

// writePage copies src (tierFormat's bytes) into every layer's K and V
// planes of device page p.
func (s *Sim) writePage(p pagedkv.PageID, src []byte) error {
	if me := s.eng.mla; me != nil {
		me.tierPage(tierFormat(&s.cfg), src, int(p), true)
		return nil
	}
	return s.eachLayer(src, p, func(l int, planes []byte, page []int32) error {
		if err := cpu.CopyPageFromHost(&s.eng.caches[l], int(p), planes); err != nil {
			return err
		}
		if dev := s.eng.dev; dev != nil {
			return dev.tierTransfer(func() error { return dev.b.UploadPages(dev.caches[l], &s.eng.caches[l], page) })
		}
		return nil
	})
}

// eachLayer calls copyLayer with each layer's K and V planes in buf (a
// page in tierFormat) and page p as a one-page list.
func (s *Sim) eachLayer(buf []byte, p pagedkv.PageID, copyLayer func(l int, planes []byte, page []int32) error) error {
	f := tierFormat(&s.cfg)
	page := []int32{int32(p)}
	for l := range s.eng.caches {
		off := f.LayerOffset(l)
		if err := copyLayer(l, buf[off:off+2*f.PlaneBytes()], page); err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
	}
	return nil
}
