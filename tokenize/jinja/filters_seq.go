package jinja

// Filters of sequences and mappings: jinja2's filters.py for the filters that iterate,
// select, sort, group and aggregate.

import "strings"

func jfAttr(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("attr", []string{"name"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	name, err := jWantStr("attr", a[0])
	if err != nil {
		return jv{}, err
	}
	if v.k == jkUndef {
		return jv{}, jUndefError(v)
	}
	if r, ok := e.attribute(v, name); ok {
		return r, nil
	}
	return jUndefAttr(v, name), nil
}

func jfBatch(_ *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("batch", []string{"linecount", "fill_with"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	n, err := jWantInt("batch", a[0])
	if err != nil {
		return jv{}, err
	}
	if n <= 0 {
		return jv{}, jErrorf("ValueError", "batch size must be positive")
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	var out []jv
	for i := 0; i < len(items); i += n {
		end := i + n
		var row []jv
		if end > len(items) {
			row = append(row, items[i:]...)
			if a[1].k != jkMissing && a[1].k != jkNone {
				for len(row) < n {
					row = append(row, a[1])
				}
			}
		} else {
			row = append(row, items[i:end]...)
		}
		out = append(out, jListV(row))
	}
	return jGenV(out, "do_batch"), nil
}

func jfDictsort(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("dictsort", []string{"case_sensitive", "by", "reverse"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	if v.k != jkDict {
		if v.k == jkUndef {
			return jv{}, jUndefError(v)
		}
		return jv{}, jErrorf("AttributeError", "'%s' object has no attribute 'items'", jValueTypeName(v))
	}
	pos := 0
	switch by := jOr(a[1], jStrV("key")); {
	case by.k == jkStr && by.s == "key":
	case by.k == jkStr && by.s == "value":
		pos = 1
	default:
		return jv{}, jErrorf("FilterArgumentError", "You can only sort by either \"key\" or \"value\"")
	}
	cs := jTruthy(jOr(a[0], jvFalse))
	d := v.dict()
	pairs := make([]jv, len(d.keys))
	for i := range d.keys {
		pairs[i] = jTupleV([]jv{d.keys[i], d.vals[i]})
	}
	key := func(p jv) jv {
		k := p.list().items[pos]
		if !cs {
			k = jIgnoreCase(k)
		}
		return k
	}
	out, err := jSortValues(pairs, key, jTruthy(jOr(a[2], jvFalse)))
	if err != nil {
		return jv{}, err
	}
	return jListV(out), nil
}

// jSortValues is Python's sorted(items, key=key, reverse=reverse) (stable).
func jSortValues(items []jv, key func(jv) jv, reverse bool) ([]jv, error) {
	keys := make([]jv, len(items))
	for i, it := range items {
		keys[i] = key(it)
	}
	idx := make([]int, len(items))
	for i := range idx {
		idx[i] = i
	}
	var cmpErr error
	less := func(x, y int) bool {
		if cmpErr != nil {
			return false
		}
		a, b := keys[x], keys[y]
		if reverse {
			a, b = b, a
		}
		c, err := jCompare("<", a, b)
		if err == errNaNCompare {
			return false
		}
		if err != nil {
			cmpErr = err
			return false
		}
		return c < 0
	}
	jSortInts(idx, less)
	if cmpErr != nil {
		return nil, cmpErr
	}
	out := make([]jv, len(items))
	for i, j := range idx {
		out[i] = items[j]
	}
	return out, nil
}

func jfFirst(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	if v.k == jkGen {
		g := v.o.(*jGen)
		if g.pos < len(g.items) {
			g.pos++
			return g.items[g.pos-1], nil
		}
		return jUndefHinted("No first item, sequence was empty.", false), nil
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	if len(items) == 0 {
		return jUndefHinted("No first item, sequence was empty.", false), nil
	}
	return items[0], nil
}

func jfLast(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	if v.k == jkGen {
		return jv{}, jErrorf("TypeError", "'%s' object is not reversible", jValueTypeName(v))
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	if len(items) == 0 {
		return jUndefHinted("No last item, sequence was empty.", false), nil
	}
	return items[len(items)-1], nil
}

func jfGroupby(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("groupby", []string{"attribute", "default", "case_sensitive"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	if a[0].k == jkMissing {
		return jv{}, jErrorf("TypeError", "groupby() missing 1 required positional argument: 'attribute'")
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	parts := jAttrParts(a[0])
	cs := jTruthy(jOr(a[2], jvFalse))
	def := jOr(a[1], jvNone)
	key := func(it jv) jv {
		k, err2 := e.attrGet(it, parts, def)
		if err2 != nil {
			err = err2
		}
		if !cs {
			k = jIgnoreCase(k)
		}
		return k
	}
	sorted, err2 := jSortValues(items, key, false)
	if err != nil {
		return jv{}, err
	}
	if err2 != nil {
		return jv{}, err2
	}
	var out []jv
	for i := 0; i < len(sorted); {
		k := key(sorted[i])
		j := i + 1
		for j < len(sorted) && jEqual(key(sorted[j]), k) {
			j++
		}
		grouper := k
		if !cs {
			// the grouper is the value of the first item of the group
			g, err := e.attrGet(sorted[i], parts, def)
			if err != nil {
				return jv{}, err
			}
			grouper = g
		}
		out = append(out, jTupleV([]jv{grouper, jListV(append([]jv(nil), sorted[i:j]...))}))
		i = j
	}
	return jListV(out), nil
}

func jfItems(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	switch v.k {
	case jkUndef:
		return jGenV(nil, "do_items"), nil
	case jkDict:
		d := v.dict()
		out := make([]jv, len(d.keys))
		for i := range d.keys {
			out[i] = jTupleV([]jv{d.keys[i], d.vals[i]})
		}
		return jGenV(out, "do_items"), nil
	}
	return jv{}, jErrorf("TypeError", "Can only get item pairs from a mapping.")
}

func jfJoin(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("join", []string{"d", "attribute"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	if a[1].k != jkMissing && a[1].k != jkNone {
		parts := jAttrParts(a[1])
		mapped := make([]jv, len(items))
		for i, it := range items {
			if mapped[i], err = e.attrGet(it, parts, jv{k: jkMissing}); err != nil {
				return jv{}, err
			}
		}
		items = mapped
	}
	sep := jSoftStr(jOr(a[0], jvEmptyStr))
	var b strings.Builder
	for i, it := range items {
		if i > 0 {
			b.WriteString(sep)
		}
		jWriteStr(&b, it)
	}
	return jStrV(b.String()), nil
}

func jfLength(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	n, err := jLen(v)
	if err != nil {
		return jv{}, err
	}
	return jIntV(int64(n)), nil
}

func jfList(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	return jListV(append([]jv(nil), items...)), nil
}

func jfMap(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	out := make([]jv, len(items))
	if len(args) == 0 {
		attr, ok := kw.get("attribute")
		if !ok {
			return jv{}, jErrorf("FilterArgumentError", "map requires a filter argument")
		}
		def := jv{k: jkMissing}
		for i, n := range kw.names {
			switch n {
			case "attribute":
			case "default":
				def = kw.vals[i]
			default:
				return jv{}, jErrorf("FilterArgumentError", "Unexpected keyword argument %s", jPyQuote(n))
			}
		}
		parts := jAttrParts(attr)
		for i, it := range items {
			if out[i], err = e.attrGet(it, parts, def); err != nil {
				return jv{}, err
			}
		}
		return jGenV(out, "do_map"), nil
	}
	name, err := jWantStr("map", args[0])
	if err != nil {
		return jv{}, err
	}
	for i, it := range items {
		if out[i], err = e.callFilter(name, it, args[1:], kw); err != nil {
			return jv{}, err
		}
	}
	return jGenV(out, "do_map"), nil
}

func jMinMax(e *jEval, v jv, args []jv, kw jKw, fname string, wantMax bool) (jv, error) {
	a, err := jBind(fname, []string{"case_sensitive", "attribute"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	if len(items) == 0 {
		return jUndefHinted("No aggregated item, sequence was empty.", false), nil
	}
	cs := jTruthy(jOr(a[0], jvFalse))
	var parts []jv
	if a[1].k != jkMissing && a[1].k != jkNone {
		parts = jAttrParts(a[1])
	}
	key := func(it jv) (jv, error) {
		k := it
		if parts != nil {
			var err error
			if k, err = e.attrGet(it, parts, jv{k: jkMissing}); err != nil {
				return jv{}, err
			}
		}
		if !cs {
			k = jIgnoreCase(k)
		}
		return k, nil
	}
	best := items[0]
	bestKey, err := key(best)
	if err != nil {
		return jv{}, err
	}
	for _, it := range items[1:] {
		k, err := key(it)
		if err != nil {
			return jv{}, err
		}
		var c int
		if wantMax {
			c, err = jCompare(">", k, bestKey)
		} else {
			c, err = jCompare("<", k, bestKey)
			c = -c
		}
		if err != nil && err != errNaNCompare {
			return jv{}, err
		}
		if err == nil && c > 0 {
			best, bestKey = it, k
		}
	}
	return best, nil
}

func jfMax(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	return jMinMax(e, v, args, kw, "max", true)
}
func jfMin(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	return jMinMax(e, v, args, kw, "min", false)
}

func (e *jEval) selectOrReject(v jv, args []jv, kw jKw, attr, keep bool) (jv, error) {
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	off := 0
	var parts []jv
	if attr {
		if len(args) == 0 {
			return jv{}, jErrorf("FilterArgumentError", "Missing parameter for attribute name")
		}
		parts = jAttrParts(args[0])
		off = 1
	}
	testName := ""
	var testArgs []jv
	if len(args) > off {
		if testName, err = jWantStr("select", args[off]); err != nil {
			return jv{}, err
		}
		testArgs = args[off+1:]
	}
	var out []jv
	for _, it := range items {
		x := it
		if attr {
			if x, err = e.attrGet(it, parts, jv{k: jkMissing}); err != nil {
				return jv{}, err
			}
		}
		var ok bool
		if testName == "" {
			ok = jTruthy(x)
		} else if ok, err = e.callTest(testName, x, testArgs, kw); err != nil {
			return jv{}, err
		}
		if ok == keep {
			out = append(out, it)
		}
	}
	return jGenV(out, "select_or_reject"), nil
}

func jfSelect(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	return e.selectOrReject(v, args, kw, false, true)
}
func jfReject(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	return e.selectOrReject(v, args, kw, false, false)
}
func jfSelectattr(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	return e.selectOrReject(v, args, kw, true, true)
}
func jfRejectattr(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	return e.selectOrReject(v, args, kw, true, false)
}

func jfReverse(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	if v.k == jkStr {
		r := []rune(v.s)
		for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
			r[i], r[j] = r[j], r[i]
		}
		return jStrV(string(r)), nil
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, jErrorf("FilterArgumentError", "argument must be iterable")
	}
	out := make([]jv, len(items))
	for i, it := range items {
		out[len(items)-1-i] = it
	}
	switch v.k {
	case jkGen:
		return jListV(out), nil // reversed() fails on iterators; jinja2 falls back to a list
	case jkList:
		return jv{k: jkGen, o: &jGen{items: out, name: "list_reverseiterator"}}, nil
	case jkDict, jkView:
		return jv{k: jkGen, o: &jGen{items: out, name: "dict_reversekeyiterator"}}, nil
	}
	return jv{k: jkGen, o: &jGen{items: out, name: "reversed"}}, nil
}

func jfSlice(_ *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("slice", []string{"slices", "fill_with"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	n, err := jWantInt("slice", a[0])
	if err != nil {
		return jv{}, err
	}
	if n <= 0 {
		return jv{}, jErrorf("ZeroDivisionError", "integer division or modulo by zero")
	}
	seq, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	length := len(seq)
	per := length / n
	extra := length % n
	offset := 0
	var out []jv
	for i := 0; i < n; i++ {
		start := offset + i*per
		if i < extra {
			offset++
		}
		end := offset + (i+1)*per
		tmp := append([]jv(nil), seq[start:end]...)
		if a[1].k != jkMissing && a[1].k != jkNone && i >= extra {
			tmp = append(tmp, a[1])
		}
		out = append(out, jListV(tmp))
	}
	return jGenV(out, "sync_do_slice"), nil
}

func jfSort(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("sort", []string{"reverse", "case_sensitive", "attribute"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	cs := jTruthy(jOr(a[1], jvFalse))
	var attrs [][]jv
	if a[2].k != jkMissing && a[2].k != jkNone {
		if a[2].k == jkStr {
			for _, part := range strings.Split(a[2].s, ",") {
				attrs = append(attrs, jAttrParts(jStrV(part)))
			}
		} else {
			attrs = [][]jv{{a[2]}}
		}
	}
	var kerr error
	key := func(it jv) jv {
		if attrs == nil {
			if !cs {
				return jIgnoreCase(it)
			}
			return it
		}
		ks := make([]jv, len(attrs))
		for i, p := range attrs {
			k, err := e.attrGet(it, p, jv{k: jkMissing})
			if err != nil {
				kerr = err
			}
			if !cs {
				k = jIgnoreCase(k)
			}
			ks[i] = k
		}
		if len(ks) == 1 {
			return ks[0]
		}
		return jListV(ks)
	}
	out, err := jSortValues(items, key, jTruthy(jOr(a[0], jvFalse)))
	if kerr != nil {
		return jv{}, kerr
	}
	if err != nil {
		return jv{}, err
	}
	return jListV(out), nil
}

func jfSum(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("sum", []string{"attribute", "start"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	acc := jOr(a[1], jIntV(0))
	var parts []jv
	if a[0].k != jkMissing && a[0].k != jkNone {
		parts = jAttrParts(a[0])
	}
	for _, it := range items {
		if parts != nil {
			if it, err = e.attrGet(it, parts, jv{k: jkMissing}); err != nil {
				return jv{}, err
			}
		}
		if acc.k == jkStr {
			return jv{}, jErrorf("TypeError", "sum() can't sum strings [use ''.join(seq) instead]")
		}
		if acc, err = jAdd(acc, it); err != nil {
			return jv{}, err
		}
	}
	return acc, nil
}

func jfUnique(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("unique", []string{"case_sensitive", "attribute"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	cs := jTruthy(jOr(a[0], jvFalse))
	var parts []jv
	if a[1].k != jkMissing && a[1].k != jkNone {
		parts = jAttrParts(a[1])
	}
	var seen []jv
	var out []jv
outer:
	for _, it := range items {
		k := it
		if parts != nil {
			if k, err = e.attrGet(it, parts, jv{k: jkMissing}); err != nil {
				return jv{}, err
			}
		}
		if !cs {
			k = jIgnoreCase(k)
		}
		if !jHashable(k) {
			return jv{}, jErrorf("TypeError", "unhashable type: '%s'", jValueTypeName(k))
		}
		for _, s := range seen {
			if jEqual(s, k) {
				continue outer
			}
		}
		seen = append(seen, k)
		out = append(out, it)
	}
	return jGenV(out, "do_unique"), nil
}
