package jinja

// Methods of dict and list (the non-mutating ones the sandbox allows).

func dictGet(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if len(kw.names) > 0 {
		return Value{}, errorf("TypeError", "dict.get() takes no keyword arguments")
	}
	if len(args) < 1 || len(args) > 2 {
		return Value{}, errorf("TypeError", "get expected at least 1 argument, got %d", len(args))
	}
	if !hashable(args[0]) {
		return Value{}, errorf("TypeError", "unhashable type: '%s'", args[0].TypeName())
	}
	if v, ok := r.dict().get(args[0]); ok {
		return v, nil
	}
	if len(args) == 2 {
		return args[1], nil
	}
	return noneValue, nil
}

func dictItems(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if len(args) > 0 || len(kw.names) > 0 {
		return Value{}, errorf("TypeError", "dict.items() takes no arguments (%d given)", len(args))
	}
	d := r.dict()
	out := make([]Value, len(d.keys))
	pairs := make([]list, len(d.keys))
	for i := range d.keys {
		pairs[i].items = []Value{d.keys[i], d.vals[i]}
		out[i] = Value{k: kindTuple, o: &pairs[i]}
	}
	return Value{k: kindView, o: &dictView{items: out, name: "dict_items"}}, nil
}

func dictKeys(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if len(args) > 0 || len(kw.names) > 0 {
		return Value{}, errorf("TypeError", "dict.keys() takes no arguments (%d given)", len(args))
	}
	return Value{k: kindView, o: &dictView{items: r.dict().keys, name: "dict_keys"}}, nil
}

func dictValues(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if len(args) > 0 || len(kw.names) > 0 {
		return Value{}, errorf("TypeError", "dict.values() takes no arguments (%d given)", len(args))
	}
	return Value{k: kindView, o: &dictView{items: r.dict().vals, name: "dict_values"}}, nil
}

func dictCopy(_ *evaluator, r Value, _ []Value, _ kwargs) (Value, error) {
	return DictValue(r.dict().copy()), nil
}

func listCount(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if len(args) != 1 || len(kw.names) > 0 {
		return Value{}, errorf("TypeError", "count() takes exactly one argument (%d given)", len(args))
	}
	n := 0
	for _, it := range r.list().items {
		if equal(it, args[0]) {
			n++
		}
	}
	return intValue(int64(n)), nil
}

func listIndex(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if len(args) < 1 || len(args) > 3 || len(kw.names) > 0 {
		return Value{}, errorf("TypeError", "index expected at least 1 argument, got %d", len(args))
	}
	items := r.list().items
	start, stop := 0, len(items)
	for i, a := range args[1:] {
		if a.k != KindInt && a.k != KindBool {
			return Value{}, errorf("TypeError", "slice indices must be integers or have an __index__ method")
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
		if equal(items[i], args[0]) {
			return intValue(int64(i)), nil
		}
	}
	return Value{}, errorf("ValueError", "%s is not in list", args[0].Repr())
}

func listCopy(_ *evaluator, r Value, _ []Value, _ kwargs) (Value, error) {
	return ListValue(append([]Value(nil), r.list().items...)), nil
}
