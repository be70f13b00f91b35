package jinja

// Methods of dict and list (the non-mutating ones the sandbox allows).

func jdGet(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if len(kw.names) > 0 {
		return jv{}, jErrorf("TypeError", "dict.get() takes no keyword arguments")
	}
	if len(args) < 1 || len(args) > 2 {
		return jv{}, jErrorf("TypeError", "get expected at least 1 argument, got %d", len(args))
	}
	if !jHashable(args[0]) {
		return jv{}, jErrorf("TypeError", "unhashable type: '%s'", jValueTypeName(args[0]))
	}
	if v, ok := r.dict().get(args[0]); ok {
		return v, nil
	}
	if len(args) == 2 {
		return args[1], nil
	}
	return jvNone, nil
}

func jdItems(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if len(args) > 0 || len(kw.names) > 0 {
		return jv{}, jErrorf("TypeError", "dict.items() takes no arguments (%d given)", len(args))
	}
	d := r.dict()
	out := make([]jv, len(d.keys))
	pairs := make([]jList, len(d.keys))
	for i := range d.keys {
		pairs[i].items = []jv{d.keys[i], d.vals[i]}
		out[i] = jv{k: jkTuple, o: &pairs[i]}
	}
	return jv{k: jkView, o: &jView{items: out, name: "dict_items"}}, nil
}

func jdKeys(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if len(args) > 0 || len(kw.names) > 0 {
		return jv{}, jErrorf("TypeError", "dict.keys() takes no arguments (%d given)", len(args))
	}
	return jv{k: jkView, o: &jView{items: r.dict().keys, name: "dict_keys"}}, nil
}

func jdValues(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if len(args) > 0 || len(kw.names) > 0 {
		return jv{}, jErrorf("TypeError", "dict.values() takes no arguments (%d given)", len(args))
	}
	return jv{k: jkView, o: &jView{items: r.dict().vals, name: "dict_values"}}, nil
}

func jdCopy(_ *jEval, r jv, _ []jv, _ jKw) (jv, error) { return jDictV(r.dict().copy()), nil }

func jlCount(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if len(args) != 1 || len(kw.names) > 0 {
		return jv{}, jErrorf("TypeError", "count() takes exactly one argument (%d given)", len(args))
	}
	n := 0
	for _, it := range r.list().items {
		if jEqual(it, args[0]) {
			n++
		}
	}
	return jIntV(int64(n)), nil
}

func jlIndex(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if len(args) < 1 || len(args) > 3 || len(kw.names) > 0 {
		return jv{}, jErrorf("TypeError", "index expected at least 1 argument, got %d", len(args))
	}
	items := r.list().items
	start, stop := 0, len(items)
	for i, a := range args[1:] {
		if a.k != jkInt && a.k != jkBool {
			return jv{}, jErrorf("TypeError", "slice indices must be integers or have an __index__ method")
		}
		v := int(a.n)
		if v < 0 {
			v += len(items)
			if v < 0 {
				v = 0
			}
		}
		if v > len(items) {
			v = len(items)
		}
		if i == 0 {
			start = v
		} else {
			stop = v
		}
	}
	for i := start; i < stop; i++ {
		if jEqual(items[i], args[0]) {
			return jIntV(int64(i)), nil
		}
	}
	return jv{}, jErrorf("ValueError", "%s is not in list", jRepr(args[0]))
}

func jlCopy(_ *jEval, r jv, _ []jv, _ jKw) (jv, error) {
	return jListV(append([]jv(nil), r.list().items...)), nil
}
