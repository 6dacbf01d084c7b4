// Package boltfile is a bounds-checked reader of bbolt's file format.
//
// bbolt trusts its file: a damaged branch page sends its cursor out of the
// mapping, which is a panic (the queue recovers it) or, in the freelist
// rebuild that bbolt's Open runs in a goroutine of its own after an
// unclean stop, a crash no recover reaches. This reader checks every offset
// against the file before it follows it, so it can tell whether a file is
// whole before bbolt walks it (Check, used by the queue's Open), and it can
// read what is left of a damaged one (Walk and ScanPages, used by
// queue/salvage). It knows bbolt's pages and buckets, nothing of what the
// queue keeps in them.
//
// The layout it reads (bbolt 1.3 to 1.5, little-endian on every platform
// greyrelay is built for): pages of the size the meta page states; page 0
// and 1 are meta pages, each with an FNV-64a checksum, the newer valid one
// (higher transaction ID) names the root bucket. Every page starts with a
// 16-byte header (id, flags, element count, overflow pages). A branch page
// holds elements (pos, ksize, child page id) and a leaf page elements
// (flags, pos, ksize, vsize), each pos counted from the element itself. A
// leaf element flagged as a bucket has a value that starts with the
// bucket's root page id and sequence; a root of 0 means the bucket's
// single leaf page follows inline in the value.
package boltfile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
)

// The parts of bbolt's layout a caller that edits a file's bytes (a test
// that damages one) needs.
const (
	PageHeaderSize = 16         // every page starts with its id, flags, count and overflow
	PageElemSize   = 16         // one branch or leaf element
	PageBranch     = 0x01       // the flags of a branch page
	PageLeaf       = 0x02       // the flags of a leaf page
	NoFreelist     = ^uint64(0) // Meta.Freelist when the freelist was not written (NoFreelistSync)
)

const (
	bucketHeadSize = 16
	pageMeta       = 0x04
	leafIsBucket   = 0x01
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	maxTreeDepth   = 64
)

// Meta is the part of a bbolt meta page this reader uses.
type Meta struct {
	PageSize uint32
	Root     uint64 // the root bucket's root page
	Freelist uint64 // NoFreelist: the freelist was not written (NoFreelistSync)
	PGID     uint64 // the high-water mark: pages at or above it are not in use
	TxID     uint64
}

// parseMeta reads the meta page at the start of b.
func parseMeta(b []byte) (Meta, bool) {
	const metaSize = 64 // magic .. checksum
	if len(b) < PageHeaderSize+metaSize {
		return Meta{}, false
	}
	le := binary.LittleEndian
	if le.Uint16(b[8:])&pageMeta == 0 {
		return Meta{}, false
	}
	m := b[PageHeaderSize : PageHeaderSize+metaSize]
	h := fnv.New64a()
	h.Write(m[:56])
	if le.Uint32(m) != boltMagic || le.Uint32(m[4:]) != boltVersion || le.Uint64(m[56:]) != h.Sum64() {
		return Meta{}, false
	}
	mp := Meta{PageSize: le.Uint32(m[8:]), Root: le.Uint64(m[16:]), Freelist: le.Uint64(m[32:]),
		PGID: le.Uint64(m[40:]), TxID: le.Uint64(m[48:])}
	if mp.PageSize < 512 || mp.PageSize > 1<<24 || mp.PageSize&(mp.PageSize-1) != 0 {
		return Meta{}, false
	}
	return mp, true
}

// File is a bbolt file's bytes and its newest valid meta page.
type File struct {
	b     []byte
	psize int
	meta  Meta
	valid bool // a valid meta page was found; psize is a guess otherwise
}

// New finds the page size and the newest valid meta page of the file b, as
// bbolt does: page 0's meta, or page 1's at every page size bbolt may have
// used. guess is the page size assumed when no meta page is valid (the
// system's, which bbolt uses for a new file).
func New(b []byte, guess int) *File {
	f := &File{b: b, psize: guess}
	m0, ok0 := parseMeta(b)
	if ok0 {
		f.psize, f.meta, f.valid = int(m0.PageSize), m0, true
	}
	for ps := 1024; ps <= 1<<24 && ps < len(b); ps *= 2 {
		if m1, ok := parseMeta(b[ps:]); ok && int(m1.PageSize) == ps && (!ok0 || ps == f.psize) {
			if !f.valid || m1.TxID > f.meta.TxID {
				f.meta = m1
			}
			f.psize, f.valid = ps, true
			break
		}
	}
	return f
}

// Valid reports whether a valid meta page was found.
func (f *File) Valid() bool { return f.valid }

// Meta returns the newest valid meta page (the zero Meta without one).
func (f *File) Meta() Meta { return f.meta }

// Page returns page id with its overflow pages, or why it cannot: every
// offset is checked against the file, and the page's header must name it.
func (f *File) Page(id uint64) ([]byte, error) {
	n := uint64(len(f.b)) / uint64(f.psize)
	if id < 2 || id >= n || (f.valid && id >= f.meta.PGID) {
		return nil, fmt.Errorf("page %d: out of the file (%d pages)", id, n)
	}
	off := id * uint64(f.psize)
	p := f.b[off:]
	if got := binary.LittleEndian.Uint64(p); got != id {
		return nil, fmt.Errorf("page %d: header names page %d", id, got)
	}
	over := uint64(binary.LittleEndian.Uint32(p[12:]))
	if over >= n-id {
		return nil, fmt.Errorf("page %d: %d overflow pages run past the file", id, over)
	}
	return p[:(over+1)*uint64(f.psize)], nil
}

// Elem is one element of a branch or leaf page.
type Elem struct {
	Key, Value []byte
	Child      uint64 // branch pages
	Bucket     bool   // leaf pages: the value is a bucket
}

// Elems parses the elements of a branch or leaf page p, checking every
// offset against p and the order of the keys.
func Elems(p []byte) (flags uint16, es []Elem, err error) {
	if len(p) < PageHeaderSize {
		return 0, nil, errors.New("short page")
	}
	le := binary.LittleEndian
	flags, count := le.Uint16(p[8:]), int(le.Uint16(p[10:]))
	if flags != PageBranch && flags != PageLeaf {
		return flags, nil, fmt.Errorf("page type %#x is neither branch nor leaf", flags)
	}
	if PageHeaderSize+count*PageElemSize > len(p) {
		return flags, nil, fmt.Errorf("%d elements do not fit the page", count)
	}
	es = make([]Elem, count)
	for i := range es {
		at := PageHeaderSize + i*PageElemSize
		e := p[at : at+PageElemSize]
		var pos, ks, vs uint64
		if flags == PageBranch {
			pos, ks = uint64(le.Uint32(e)), uint64(le.Uint32(e[4:]))
			es[i].Child = le.Uint64(e[8:])
		} else {
			es[i].Bucket = le.Uint32(e)&leafIsBucket != 0
			pos, ks, vs = uint64(le.Uint32(e[4:])), uint64(le.Uint32(e[8:])), uint64(le.Uint32(e[12:]))
		}
		start := uint64(at) + pos
		if start+ks+vs > uint64(len(p)) {
			return flags, nil, fmt.Errorf("element %d points past the page", i)
		}
		es[i].Key, es[i].Value = p[start:start+ks], p[start+ks:start+ks+vs]
		if i > 0 && bytes.Compare(es[i-1].Key, es[i].Key) >= 0 {
			return flags, nil, fmt.Errorf("element %d: keys out of order", i)
		}
	}
	return flags, es, nil
}

// Visitor receives what a walk finds; any of its functions may be nil.
// bucket is the path of bucket names from the root (nil for the root
// bucket itself). The slices handed over point into the file's bytes.
type Visitor struct {
	// KV gets every key/value pair that is not a bucket.
	KV func(bucket [][]byte, k, v []byte)
	// Lost gets every key range [lo, hi) of a bucket whose page could not
	// be read (nil bounds are open); the walk goes on with the rest.
	Lost func(bucket [][]byte, lo, hi []byte, err error)
	// Seq gets the sequence of every bucket found.
	Seq func(bucket [][]byte, seq uint64)
}

// walker walks a bucket tree with File's checks, and the ones bbolt's
// consistency check makes: each page is referenced once, its keys lie
// within the range its parent gives it.
type walker struct {
	f    *File
	v    Visitor
	seen map[uint64]bool
	errs []error
	// elems counts the elements parsed: every element of a sound file
	// takes 16 bytes of it, so more than len/16 means damaged data makes
	// the walk parse the same bytes again and again.
	elems int
}

// spend counts the n elements the page at p is about to be parsed for;
// false means the walk has already parsed more than a sound file holds.
func (w *walker) spend(p []byte) bool {
	if len(p) >= PageHeaderSize {
		w.elems += int(binary.LittleEndian.Uint16(p[10:]))
	}
	return w.elems <= len(w.f.b)/PageElemSize
}

var errTooMany = errors.New("more elements than the file can hold")

func (w *walker) fail(bucket [][]byte, lo, hi []byte, err error) {
	w.errs = append(w.errs, err)
	if w.v.Lost != nil {
		w.v.Lost(bucket, lo, hi, err)
	}
}

// Walk walks the whole tree from the newest valid meta page's root,
// handing v what it finds, and returns every problem it met (nil: the
// tree is whole). It checks what bbolt's consistency check does: each page
// is referenced once, its keys lie within the range its parent gives it.
func (f *File) Walk(v Visitor) []error {
	w := &walker{f: f, v: v, seen: map[uint64]bool{}}
	w.walk()
	return w.errs
}

// walk walks the whole tree from the meta page's root.
func (w *walker) walk() {
	if !w.f.valid {
		w.fail(nil, nil, nil, errors.New("no valid meta page"))
		return
	}
	w.node(nil, w.f.meta.Root, nil, nil, 0)
}

// bucketValue walks the bucket whose header is v.
func (w *walker) bucketValue(path [][]byte, v []byte, depth int) {
	if len(v) < bucketHeadSize {
		w.fail(path, nil, nil, fmt.Errorf("bucket %q: short header", path))
		return
	}
	root := binary.LittleEndian.Uint64(v)
	if root != 0 {
		w.node(path, root, nil, nil, depth+1)
		return
	}
	if !w.spend(v[bucketHeadSize:]) {
		w.fail(path, nil, nil, fmt.Errorf("bucket %q: %w", path, errTooMany))
		return
	}
	flags, es, err := Elems(v[bucketHeadSize:])
	if err == nil && flags != PageLeaf {
		err = errors.New("inline bucket page is not a leaf")
	}
	for _, e := range es {
		if err == nil && e.Bucket {
			err = errors.New("a bucket inside an inline bucket") // bbolt never inlines those
		}
	}
	if err != nil {
		w.fail(path, nil, nil, fmt.Errorf("bucket %q: inline page: %w", path, err))
		return
	}
	w.leaf(path, es, depth)
}

// node walks page id, whose keys must lie in [lo, hi).
func (w *walker) node(path [][]byte, id uint64, lo, hi []byte, depth int) {
	p, err := w.f.Page(id)
	if err == nil && depth > maxTreeDepth {
		err = errors.New("tree too deep")
	}
	if err == nil && w.seen[id] {
		err = fmt.Errorf("page %d: referenced twice", id)
	}
	var flags uint16
	var es []Elem
	if err == nil && !w.spend(p) {
		err = errTooMany
	}
	if err == nil {
		w.seen[id] = true
		flags, es, err = Elems(p)
	}
	if err == nil && len(es) > 0 && (lo != nil && bytes.Compare(es[0].Key, lo) < 0 ||
		hi != nil && bytes.Compare(es[len(es)-1].Key, hi) >= 0) {
		err = fmt.Errorf("page %d: keys outside the range its parent gives", id)
	}
	if err != nil {
		w.fail(path, lo, hi, fmt.Errorf("bucket %q: %w", path, err))
		return
	}
	for i := 1; i < int(binary.LittleEndian.Uint32(p[12:]))+1; i++ {
		w.seen[id+uint64(i)] = true
	}
	if flags == PageLeaf {
		w.leaf(path, es, depth)
		return
	}
	for i, e := range es {
		clo, chi := e.Key, hi
		if i == 0 {
			clo = lo
		}
		if i+1 < len(es) {
			chi = es[i+1].Key
		}
		w.node(path, e.Child, clo, chi, depth+1)
	}
}

func (w *walker) leaf(path [][]byte, es []Elem, depth int) {
	for _, e := range es {
		if e.Bucket {
			if w.v.Seq != nil && len(e.Value) >= bucketHeadSize {
				w.v.Seq(append(path[:len(path):len(path)], e.Key), binary.LittleEndian.Uint64(e.Value[8:]))
			}
			w.bucketValue(append(path[:len(path):len(path)], e.Key), e.Value, depth)
		} else if w.v.KV != nil {
			w.v.KV(path, e.Key, e.Value)
		}
	}
}

// Check reports the first problem a walk of the whole tree finds in the
// file's bytes b, or nil when bbolt can walk it safely; guess is New's.
func Check(b []byte, guess int) error {
	if errs := New(b, guess).Walk(Visitor{}); len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// ScanPages hands every leaf element of every page that parses as a leaf
// to kv, page after page, whatever tree the page belongs to (or belonged
// to: freed pages keep older versions of records). Inline bucket pages
// are read too; their elements come with the bucket name.
func (f *File) ScanPages(kv func(bucket []byte, k, v []byte)) {
	n := uint64(len(f.b)) / uint64(f.psize)
	budget := 2 * len(f.b) / PageElemSize // elements parsed, as in walker.spend
	for id := uint64(2); id < n && budget > 0; id++ {
		p := f.b[id*uint64(f.psize):]
		if binary.LittleEndian.Uint64(p) != id {
			continue
		}
		if over := uint64(binary.LittleEndian.Uint32(p[12:])); over < n-id {
			p = p[:(over+1)*uint64(f.psize)]
		} else {
			p = p[:f.psize] // the rest is gone: what fits in this page may still parse
		}
		budget -= int(binary.LittleEndian.Uint16(p[10:]))
		flags, es, err := Elems(p)
		if err != nil || flags != PageLeaf {
			continue
		}
		for _, e := range es {
			if !e.Bucket {
				kv(nil, e.Key, e.Value)
				continue
			}
			if len(e.Value) < bucketHeadSize+PageHeaderSize || binary.LittleEndian.Uint64(e.Value) != 0 {
				continue
			}
			if budget -= int(binary.LittleEndian.Uint16(e.Value[bucketHeadSize+10:])); budget < 0 {
				return
			}
			if fl, ies, err := Elems(e.Value[bucketHeadSize:]); err == nil && fl == PageLeaf {
				for _, ie := range ies {
					if !ie.Bucket {
						kv(e.Key, ie.Key, ie.Value)
					}
				}
			}
		}
	}
}
