package queue

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
)

// A bounds-checked reader of bbolt's file format.
//
// bbolt trusts its file: a damaged branch page sends its cursor out of the
// mapping, which is a panic (recovered by guard, see guard.go) or, in the
// freelist rebuild that bbolt's Open runs in a goroutine of its own after an
// unclean stop, a crash no recover reaches. This reader checks every offset
// against the file before it follows it, so it can tell whether a file is
// whole before bbolt walks it (checkPages), and it can read what is left of
// a damaged one (Salvage).
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

const (
	pageHeaderSize = 16
	pageElemSize   = 16
	bucketHeadSize = 16
	pageBranch     = 0x01
	pageLeaf       = 0x02
	pageMeta       = 0x04
	leafIsBucket   = 0x01
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	noFreelist     = ^uint64(0)
	maxTreeDepth   = 64
)

// metaPage is the part of a bbolt meta page this reader uses.
type metaPage struct {
	pageSize uint32
	root     uint64 // the root bucket's root page
	freelist uint64 // noFreelist: the freelist was not written (NoFreelistSync)
	pgid     uint64 // the high-water mark: pages at or above it are not in use
	txid     uint64
}

// parseMeta reads the meta page at the start of b.
func parseMeta(b []byte) (metaPage, bool) {
	const metaSize = 64 // magic .. checksum
	if len(b) < pageHeaderSize+metaSize {
		return metaPage{}, false
	}
	le := binary.LittleEndian
	if le.Uint16(b[8:])&pageMeta == 0 {
		return metaPage{}, false
	}
	m := b[pageHeaderSize : pageHeaderSize+metaSize]
	h := fnv.New64a()
	h.Write(m[:56])
	if le.Uint32(m) != boltMagic || le.Uint32(m[4:]) != boltVersion || le.Uint64(m[56:]) != h.Sum64() {
		return metaPage{}, false
	}
	mp := metaPage{pageSize: le.Uint32(m[8:]), root: le.Uint64(m[16:]), freelist: le.Uint64(m[32:]),
		pgid: le.Uint64(m[40:]), txid: le.Uint64(m[48:])}
	if mp.pageSize < 512 || mp.pageSize > 1<<24 || mp.pageSize&(mp.pageSize-1) != 0 {
		return metaPage{}, false
	}
	return mp, true
}

// pageFile is a bbolt file's bytes and its newest valid meta page.
type pageFile struct {
	b     []byte
	psize int
	meta  metaPage
	valid bool // a valid meta page was found; psize is a guess otherwise
}

// newPageFile finds the page size and the newest valid meta page, as bbolt
// does: page 0's meta, or page 1's at every page size bbolt may have used.
func newPageFile(b []byte, guess int) *pageFile {
	f := &pageFile{b: b, psize: guess}
	m0, ok0 := parseMeta(b)
	if ok0 {
		f.psize, f.meta, f.valid = int(m0.pageSize), m0, true
	}
	for ps := 1024; ps <= 1<<24 && ps < len(b); ps *= 2 {
		if m1, ok := parseMeta(b[ps:]); ok && int(m1.pageSize) == ps && (!ok0 || ps == f.psize) {
			if !f.valid || m1.txid > f.meta.txid {
				f.meta = m1
			}
			f.psize, f.valid = ps, true
			break
		}
	}
	return f
}

// page returns page id with its overflow pages, or why it cannot.
func (f *pageFile) page(id uint64) ([]byte, error) {
	n := uint64(len(f.b)) / uint64(f.psize)
	if id < 2 || id >= n || (f.valid && id >= f.meta.pgid) {
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

// elem is one element of a branch or leaf page.
type elem struct {
	key, value []byte
	child      uint64 // branch pages
	bucket     bool   // leaf pages: the value is a bucket
}

// elems parses the elements of a branch or leaf page p, checking every
// offset against p and the order of the keys.
func elems(p []byte) (flags uint16, es []elem, err error) {
	if len(p) < pageHeaderSize {
		return 0, nil, errors.New("short page")
	}
	le := binary.LittleEndian
	flags, count := le.Uint16(p[8:]), int(le.Uint16(p[10:]))
	if flags != pageBranch && flags != pageLeaf {
		return flags, nil, fmt.Errorf("page type %#x is neither branch nor leaf", flags)
	}
	if pageHeaderSize+count*pageElemSize > len(p) {
		return flags, nil, fmt.Errorf("%d elements do not fit the page", count)
	}
	es = make([]elem, count)
	for i := range es {
		at := pageHeaderSize + i*pageElemSize
		e := p[at : at+pageElemSize]
		var pos, ks, vs uint64
		if flags == pageBranch {
			pos, ks = uint64(le.Uint32(e)), uint64(le.Uint32(e[4:]))
			es[i].child = le.Uint64(e[8:])
		} else {
			es[i].bucket = le.Uint32(e)&leafIsBucket != 0
			pos, ks, vs = uint64(le.Uint32(e[4:])), uint64(le.Uint32(e[8:])), uint64(le.Uint32(e[12:]))
		}
		start := uint64(at) + pos
		if start+ks+vs > uint64(len(p)) {
			return flags, nil, fmt.Errorf("element %d points past the page", i)
		}
		es[i].key, es[i].value = p[start:start+ks], p[start+ks:start+ks+vs]
		if i > 0 && bytes.Compare(es[i-1].key, es[i].key) >= 0 {
			return flags, nil, fmt.Errorf("element %d: keys out of order", i)
		}
	}
	return flags, es, nil
}

// treeVisitor receives what a walk finds. bucket is the path of bucket
// names from the root (nil for the root bucket itself).
type treeVisitor struct {
	// kv gets every key/value pair that is not a bucket.
	kv func(bucket [][]byte, k, v []byte)
	// lost gets every key range [lo, hi) of a bucket whose page could not
	// be read (nil bounds are open); the walk goes on with the rest.
	lost func(bucket [][]byte, lo, hi []byte, err error)
	// seq gets the sequence of every bucket found.
	seq func(bucket [][]byte, seq uint64)
}

// walker walks a bucket tree with pageFile's checks, and the ones bbolt's
// consistency check makes: each page is referenced once, its keys lie
// within the range its parent gives it.
type walker struct {
	f    *pageFile
	v    treeVisitor
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
	if len(p) >= pageHeaderSize {
		w.elems += int(binary.LittleEndian.Uint16(p[10:]))
	}
	return w.elems <= len(w.f.b)/pageElemSize
}

var errTooMany = errors.New("more elements than the file can hold")

func (w *walker) fail(bucket [][]byte, lo, hi []byte, err error) {
	w.errs = append(w.errs, err)
	if w.v.lost != nil {
		w.v.lost(bucket, lo, hi, err)
	}
}

// walk walks the whole tree from the meta page's root.
func (w *walker) walk() {
	if !w.f.valid {
		w.fail(nil, nil, nil, errors.New("no valid meta page"))
		return
	}
	w.node(nil, w.f.meta.root, nil, nil, 0)
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
	flags, es, err := elems(v[bucketHeadSize:])
	if err == nil && flags != pageLeaf {
		err = errors.New("inline bucket page is not a leaf")
	}
	for _, e := range es {
		if err == nil && e.bucket {
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
	p, err := w.f.page(id)
	if err == nil && depth > maxTreeDepth {
		err = errors.New("tree too deep")
	}
	if err == nil && w.seen[id] {
		err = fmt.Errorf("page %d: referenced twice", id)
	}
	var flags uint16
	var es []elem
	if err == nil && !w.spend(p) {
		err = errTooMany
	}
	if err == nil {
		w.seen[id] = true
		flags, es, err = elems(p)
	}
	if err == nil && len(es) > 0 && (lo != nil && bytes.Compare(es[0].key, lo) < 0 ||
		hi != nil && bytes.Compare(es[len(es)-1].key, hi) >= 0) {
		err = fmt.Errorf("page %d: keys outside the range its parent gives", id)
	}
	if err != nil {
		w.fail(path, lo, hi, fmt.Errorf("bucket %q: %w", path, err))
		return
	}
	for i := 1; i < int(binary.LittleEndian.Uint32(p[12:]))+1; i++ {
		w.seen[id+uint64(i)] = true
	}
	if flags == pageLeaf {
		w.leaf(path, es, depth)
		return
	}
	for i, e := range es {
		clo, chi := e.key, hi
		if i == 0 {
			clo = lo
		}
		if i+1 < len(es) {
			chi = es[i+1].key
		}
		w.node(path, e.child, clo, chi, depth+1)
	}
}

func (w *walker) leaf(path [][]byte, es []elem, depth int) {
	for _, e := range es {
		if e.bucket {
			if w.v.seq != nil && len(e.value) >= bucketHeadSize {
				w.v.seq(append(path[:len(path):len(path)], e.key), binary.LittleEndian.Uint64(e.value[8:]))
			}
			w.bucketValue(append(path[:len(path):len(path)], e.key), e.value, depth)
		} else if w.v.kv != nil {
			w.v.kv(path, e.key, e.value)
		}
	}
}

// checkPages reports the first problem a walk of the whole tree finds in
// the file's bytes b, or nil when bbolt can walk it safely.
func checkPages(b []byte, guess int) error {
	f := newPageFile(b, guess)
	w := &walker{f: f, seen: map[uint64]bool{}}
	w.walk()
	if len(w.errs) > 0 {
		return w.errs[0]
	}
	return nil
}

// scanPages hands every leaf element of every page that parses as a leaf
// to kv, page after page, whatever tree the page belongs to (or belonged
// to: freed pages keep older versions of records). Inline bucket pages
// are read too; their elements come with the bucket name.
func (f *pageFile) scanPages(kv func(bucket []byte, k, v []byte)) {
	n := uint64(len(f.b)) / uint64(f.psize)
	budget := 2 * len(f.b) / pageElemSize // elements parsed, as in walker.spend
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
		flags, es, err := elems(p)
		if err != nil || flags != pageLeaf {
			continue
		}
		for _, e := range es {
			if !e.bucket {
				kv(nil, e.key, e.value)
				continue
			}
			if len(e.value) < bucketHeadSize+pageHeaderSize || binary.LittleEndian.Uint64(e.value) != 0 {
				continue
			}
			if budget -= int(binary.LittleEndian.Uint16(e.value[bucketHeadSize+10:])); budget < 0 {
				return
			}
			if fl, ies, err := elems(e.value[bucketHeadSize:]); err == nil && fl == pageLeaf {
				for _, ie := range ies {
					if !ie.bucket {
						kv(e.key, ie.key, ie.value)
					}
				}
			}
		}
	}
}
