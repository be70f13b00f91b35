package jinja

// The syntax tree the parser builds and the evaluator runs, and its walkers.

type jExpr interface{ jExprNode() }

type (
	jeConst   struct{ v jv }
	jeName    struct{ name string }
	jeGetattr struct {
		obj  jExpr
		name string
	}
	jeGetitem struct{ obj, key jExpr }
	jeSlice   struct{ start, stop, step jExpr } // only as a subscript
	jeCall    struct {
		fn   jExpr
		args jArgs
	}
	jeFilter struct {
		e    jExpr // nil inside {% filter %} / {% set x | f %} chains
		name string
		fn   jFilterFn // nil: unknown filter, an error when evaluated
		args jArgs
	}
	jeTest struct {
		e    jExpr
		name string
		fn   jTestFn
		args jArgs
	}
	jeNot struct{ e jExpr }
	jeNeg struct{ e jExpr }
	jePos struct{ e jExpr }
	jeBin struct {
		op   string
		l, r jExpr
	}
	jeAnd     struct{ l, r jExpr }
	jeOr      struct{ l, r jExpr }
	jeCompare struct {
		first jExpr
		ops   []string
		rest  []jExpr
	}
	jeConcat struct{ args []jExpr }
	jeCond   struct{ test, yes, no jExpr }
	jeList   struct{ items []jExpr }
	jeTuple  struct{ items []jExpr }
	jeDict   struct{ keys, vals []jExpr }
)

type jArgs struct {
	pos     []jExpr
	kwNames []string
	kwVals  []jExpr
	dynArgs jExpr
	dynKw   jExpr
}

func (*jeConst) jExprNode()   {}
func (*jeName) jExprNode()    {}
func (*jeGetattr) jExprNode() {}
func (*jeGetitem) jExprNode() {}
func (*jeSlice) jExprNode()   {}
func (*jeCall) jExprNode()    {}
func (*jeFilter) jExprNode()  {}
func (*jeTest) jExprNode()    {}
func (*jeNot) jExprNode()     {}
func (*jeNeg) jExprNode()     {}
func (*jePos) jExprNode()     {}
func (*jeBin) jExprNode()     {}
func (*jeAnd) jExprNode()     {}
func (*jeOr) jExprNode()      {}
func (*jeCompare) jExprNode() {}
func (*jeConcat) jExprNode()  {}
func (*jeCond) jExprNode()    {}
func (*jeList) jExprNode()    {}
func (*jeTuple) jExprNode()   {}
func (*jeDict) jExprNode()    {}

type jNode interface{ jStmtNode() }

type (
	jnData   struct{ s string }
	jnOutput struct{ e jExpr }
	jnIf     struct {
		tests  []jExpr
		bodies [][]jNode
		els    []jNode
	}
	jnFor struct {
		target    *jTarget
		iter      jExpr
		cond      jExpr
		recursive bool
		body, els []jNode
		fresh     bool // the body defines a macro: each iteration needs its own scope
	}
	jnSet struct {
		target *jTarget
		e      jExpr
	}
	jnSetBlock struct {
		target *jTarget
		filter jExpr // *jeFilter chain or nil
		body   []jNode
	}
	jnMacro     struct{ m *jMacro }
	jnCallBlock struct {
		call   *jeCall
		caller *jMacro
	}
	jnFilterBlock struct {
		filter jExpr
		body   []jNode
	}
	jnWith struct {
		targets []*jTarget
		vals    []jExpr
		body    []jNode
	}
	jnBreak       struct{}
	jnContinue    struct{}
	jnBlock       struct{ body []jNode }
	jnGeneration  struct{ body []jNode }
	jnUnsupported struct{ msg string }
)

func (*jnData) jStmtNode()        {}
func (*jnOutput) jStmtNode()      {}
func (*jnIf) jStmtNode()          {}
func (*jnFor) jStmtNode()         {}
func (*jnSet) jStmtNode()         {}
func (*jnSetBlock) jStmtNode()    {}
func (*jnMacro) jStmtNode()       {}
func (*jnCallBlock) jStmtNode()   {}
func (*jnFilterBlock) jStmtNode() {}
func (*jnWith) jStmtNode()        {}
func (*jnBreak) jStmtNode()       {}
func (*jnContinue) jStmtNode()    {}
func (*jnBlock) jStmtNode()       {}
func (*jnGeneration) jStmtNode()  {}
func (*jnUnsupported) jStmtNode() {}

// jTarget is an assignment target: a name, a (nested) tuple of names, or ns.attr.
type jTarget struct {
	name  string
	attr  string // set for namespace attribute targets
	elems []*jTarget
	tuple bool
}

type jMacro struct {
	name         string
	params       []string
	defaults     []jExpr // for the last len(defaults) params
	body         []jNode
	catchVarargs bool
	catchKwargs  bool
	usesCaller   bool
}

// ---- walking ----

// jWalkStmts visits statements in jinja2's find_all order (pre-order, fields in
// declaration order); fn returns false to stop descending.
func jWalkStmts(body []jNode, fn func(jNode) bool) {
	for _, n := range body {
		if !fn(n) {
			continue
		}
		switch x := n.(type) {
		case *jnIf:
			for i := range x.tests {
				jWalkStmts(x.bodies[i], fn)
			}
			jWalkStmts(x.els, fn)
		case *jnFor:
			jWalkStmts(x.body, fn)
			jWalkStmts(x.els, fn)
		case *jnSetBlock:
			jWalkStmts(x.body, fn)
		case *jnMacro:
			jWalkStmts(x.m.body, fn)
		case *jnCallBlock:
			jWalkStmts(x.caller.body, fn)
		case *jnFilterBlock:
			jWalkStmts(x.body, fn)
		case *jnWith:
			jWalkStmts(x.body, fn)
		case *jnBlock:
			jWalkStmts(x.body, fn)
		case *jnGeneration:
			jWalkStmts(x.body, fn)
		}
	}
}

// jWalkExprsInStmts visits every expression of the statements (not descending into
// nested macro definitions' own flags, which is what jinja2's find_undeclared does).
func jWalkExprsInStmts(body []jNode, fn func(jExpr)) {
	jWalkStmts(body, func(n jNode) bool {
		switch x := n.(type) {
		case *jnOutput:
			jWalkExpr(x.e, fn)
		case *jnIf:
			for _, t := range x.tests {
				jWalkExpr(t, fn)
			}
		case *jnFor:
			jWalkExpr(x.iter, fn)
			jWalkExpr(x.cond, fn)
		case *jnSet:
			jWalkExpr(x.e, fn)
		case *jnSetBlock:
			jWalkExpr(x.filter, fn)
		case *jnCallBlock:
			jWalkExpr(x.call, fn)
		case *jnFilterBlock:
			jWalkExpr(x.filter, fn)
		case *jnWith:
			for _, v := range x.vals {
				jWalkExpr(v, fn)
			}
		case *jnMacro:
			for _, d := range x.m.defaults {
				jWalkExpr(d, fn)
			}
			return false
		}
		return true
	})
}

func jWalkExpr(e jExpr, fn func(jExpr)) {
	if e == nil {
		return
	}
	fn(e)
	walkArgs := func(a *jArgs) {
		for _, x := range a.pos {
			jWalkExpr(x, fn)
		}
		for _, x := range a.kwVals {
			jWalkExpr(x, fn)
		}
		jWalkExpr(a.dynArgs, fn)
		jWalkExpr(a.dynKw, fn)
	}
	switch x := e.(type) {
	case *jeGetattr:
		jWalkExpr(x.obj, fn)
	case *jeGetitem:
		jWalkExpr(x.obj, fn)
		jWalkExpr(x.key, fn)
	case *jeSlice:
		jWalkExpr(x.start, fn)
		jWalkExpr(x.stop, fn)
		jWalkExpr(x.step, fn)
	case *jeCall:
		jWalkExpr(x.fn, fn)
		walkArgs(&x.args)
	case *jeFilter:
		jWalkExpr(x.e, fn)
		walkArgs(&x.args)
	case *jeTest:
		jWalkExpr(x.e, fn)
		walkArgs(&x.args)
	case *jeNot:
		jWalkExpr(x.e, fn)
	case *jeNeg:
		jWalkExpr(x.e, fn)
	case *jePos:
		jWalkExpr(x.e, fn)
	case *jeBin:
		jWalkExpr(x.l, fn)
		jWalkExpr(x.r, fn)
	case *jeAnd:
		jWalkExpr(x.l, fn)
		jWalkExpr(x.r, fn)
	case *jeOr:
		jWalkExpr(x.l, fn)
		jWalkExpr(x.r, fn)
	case *jeCompare:
		jWalkExpr(x.first, fn)
		for _, r := range x.rest {
			jWalkExpr(r, fn)
		}
	case *jeConcat:
		for _, a := range x.args {
			jWalkExpr(a, fn)
		}
	case *jeCond:
		jWalkExpr(x.test, fn)
		jWalkExpr(x.yes, fn)
		jWalkExpr(x.no, fn)
	case *jeList:
		for _, a := range x.items {
			jWalkExpr(a, fn)
		}
	case *jeTuple:
		for _, a := range x.items {
			jWalkExpr(a, fn)
		}
	case *jeDict:
		for i := range x.keys {
			jWalkExpr(x.keys[i], fn)
			jWalkExpr(x.vals[i], fn)
		}
	}
}
