package jinja

// The syntax tree the parser builds and the evaluator runs, and its walkers.

type expr interface{ exprNode() }

type (
	constExpr   struct{ v Value }
	nameExpr    struct{ name string }
	getattrExpr struct {
		obj  expr
		name string
	}
	getitemExpr struct{ obj, key expr }
	sliceExpr   struct{ start, stop, step expr } // only as a subscript
	callExpr    struct {
		fn   expr
		args callArgs
	}
	filterExpr struct {
		e    expr // nil inside {% filter %} / {% set x | f %} chains
		name string
		fn   filterFunc // nil: unknown filter, an error when evaluated
		args callArgs
	}
	testExpr struct {
		e    expr
		name string
		fn   testFunc
		args callArgs
	}
	notExpr struct{ e expr }
	negExpr struct{ e expr }
	posExpr struct{ e expr }
	binExpr struct {
		op   string
		l, r expr
	}
	andExpr     struct{ l, r expr }
	orExpr      struct{ l, r expr }
	compareExpr struct {
		first expr
		ops   []string
		rest  []expr
	}
	concatExpr struct{ args []expr }
	condExpr   struct{ test, yes, no expr }
	listExpr   struct{ items []expr }
	tupleExpr  struct{ items []expr }
	dictExpr   struct{ keys, vals []expr }
)

type callArgs struct {
	pos     []expr
	kwNames []string
	kwVals  []expr
	dynArgs expr
	dynKw   expr
}

func (*constExpr) exprNode()   {}
func (*nameExpr) exprNode()    {}
func (*getattrExpr) exprNode() {}
func (*getitemExpr) exprNode() {}
func (*sliceExpr) exprNode()   {}
func (*callExpr) exprNode()    {}
func (*filterExpr) exprNode()  {}
func (*testExpr) exprNode()    {}
func (*notExpr) exprNode()     {}
func (*negExpr) exprNode()     {}
func (*posExpr) exprNode()     {}
func (*binExpr) exprNode()     {}
func (*andExpr) exprNode()     {}
func (*orExpr) exprNode()      {}
func (*compareExpr) exprNode() {}
func (*concatExpr) exprNode()  {}
func (*condExpr) exprNode()    {}
func (*listExpr) exprNode()    {}
func (*tupleExpr) exprNode()   {}
func (*dictExpr) exprNode()    {}

type stmt interface{ stmtNode() }

type (
	dataStmt   struct{ s string }
	outputStmt struct{ e expr }
	ifStmt     struct {
		tests  []expr
		bodies [][]stmt
		els    []stmt
	}
	forStmt struct {
		target    *target
		iter      expr
		cond      expr
		recursive bool
		body, els []stmt
		fresh     bool // the body defines a macro: each iteration needs its own scope
	}
	setStmt struct {
		target *target
		e      expr
	}
	setBlockStmt struct {
		target *target
		filter expr // *filterExpr chain or nil
		body   []stmt
	}
	macroStmt     struct{ m *macro }
	callBlockStmt struct {
		call   *callExpr
		caller *macro
	}
	filterBlockStmt struct {
		filter expr
		body   []stmt
	}
	withStmt struct {
		targets []*target
		vals    []expr
		body    []stmt
	}
	breakStmt       struct{}
	continueStmt    struct{}
	blockStmt       struct{ body []stmt }
	generationStmt  struct{ body []stmt }
	unsupportedStmt struct{ msg string }
)

func (*dataStmt) stmtNode()        {}
func (*outputStmt) stmtNode()      {}
func (*ifStmt) stmtNode()          {}
func (*forStmt) stmtNode()         {}
func (*setStmt) stmtNode()         {}
func (*setBlockStmt) stmtNode()    {}
func (*macroStmt) stmtNode()       {}
func (*callBlockStmt) stmtNode()   {}
func (*filterBlockStmt) stmtNode() {}
func (*withStmt) stmtNode()        {}
func (*breakStmt) stmtNode()       {}
func (*continueStmt) stmtNode()    {}
func (*blockStmt) stmtNode()       {}
func (*generationStmt) stmtNode()  {}
func (*unsupportedStmt) stmtNode() {}

// target is an assignment target: a name, a (nested) tuple of names, or ns.attr.
type target struct {
	name  string
	attr  string // set for namespace attribute targets
	elems []*target
	tuple bool
}

type macro struct {
	name         string
	params       []string
	defaults     []expr // for the last len(defaults) params
	body         []stmt
	catchVarargs bool
	catchKwargs  bool
	usesCaller   bool
}

// ---- walking ----

// walkStmts visits statements in jinja2's find_all order (pre-order, fields in
// declaration order); fn returns false to stop descending.
func walkStmts(body []stmt, fn func(stmt) bool) {
	for _, n := range body {
		if !fn(n) {
			continue
		}
		switch x := n.(type) {
		case *ifStmt:
			for i := range x.tests {
				walkStmts(x.bodies[i], fn)
			}
			walkStmts(x.els, fn)
		case *forStmt:
			walkStmts(x.body, fn)
			walkStmts(x.els, fn)
		case *setBlockStmt:
			walkStmts(x.body, fn)
		case *macroStmt:
			walkStmts(x.m.body, fn)
		case *callBlockStmt:
			walkStmts(x.caller.body, fn)
		case *filterBlockStmt:
			walkStmts(x.body, fn)
		case *withStmt:
			walkStmts(x.body, fn)
		case *blockStmt:
			walkStmts(x.body, fn)
		case *generationStmt:
			walkStmts(x.body, fn)
		}
	}
}

// walkExprsInStmts visits every expression of the statements (not descending into
// nested macro definitions' own flags, which is what jinja2's find_undeclared does).
func walkExprsInStmts(body []stmt, fn func(expr)) {
	walkStmts(body, func(n stmt) bool {
		switch x := n.(type) {
		case *outputStmt:
			walkExpr(x.e, fn)
		case *ifStmt:
			for _, t := range x.tests {
				walkExpr(t, fn)
			}
		case *forStmt:
			walkExpr(x.iter, fn)
			walkExpr(x.cond, fn)
		case *setStmt:
			walkExpr(x.e, fn)
		case *setBlockStmt:
			walkExpr(x.filter, fn)
		case *callBlockStmt:
			walkExpr(x.call, fn)
		case *filterBlockStmt:
			walkExpr(x.filter, fn)
		case *withStmt:
			for _, v := range x.vals {
				walkExpr(v, fn)
			}
		case *macroStmt:
			for _, d := range x.m.defaults {
				walkExpr(d, fn)
			}
			return false
		}
		return true
	})
}

func walkExpr(e expr, fn func(expr)) {
	if e == nil {
		return
	}
	fn(e)
	walkArgs := func(a *callArgs) {
		for _, x := range a.pos {
			walkExpr(x, fn)
		}
		for _, x := range a.kwVals {
			walkExpr(x, fn)
		}
		walkExpr(a.dynArgs, fn)
		walkExpr(a.dynKw, fn)
	}
	switch x := e.(type) {
	case *getattrExpr:
		walkExpr(x.obj, fn)
	case *getitemExpr:
		walkExpr(x.obj, fn)
		walkExpr(x.key, fn)
	case *sliceExpr:
		walkExpr(x.start, fn)
		walkExpr(x.stop, fn)
		walkExpr(x.step, fn)
	case *callExpr:
		walkExpr(x.fn, fn)
		walkArgs(&x.args)
	case *filterExpr:
		walkExpr(x.e, fn)
		walkArgs(&x.args)
	case *testExpr:
		walkExpr(x.e, fn)
		walkArgs(&x.args)
	case *notExpr:
		walkExpr(x.e, fn)
	case *negExpr:
		walkExpr(x.e, fn)
	case *posExpr:
		walkExpr(x.e, fn)
	case *binExpr:
		walkExpr(x.l, fn)
		walkExpr(x.r, fn)
	case *andExpr:
		walkExpr(x.l, fn)
		walkExpr(x.r, fn)
	case *orExpr:
		walkExpr(x.l, fn)
		walkExpr(x.r, fn)
	case *compareExpr:
		walkExpr(x.first, fn)
		for _, r := range x.rest {
			walkExpr(r, fn)
		}
	case *concatExpr:
		for _, a := range x.args {
			walkExpr(a, fn)
		}
	case *condExpr:
		walkExpr(x.test, fn)
		walkExpr(x.yes, fn)
		walkExpr(x.no, fn)
	case *listExpr:
		for _, a := range x.items {
			walkExpr(a, fn)
		}
	case *tupleExpr:
		for _, a := range x.items {
			walkExpr(a, fn)
		}
	case *dictExpr:
		for i := range x.keys {
			walkExpr(x.keys[i], fn)
			walkExpr(x.vals[i], fn)
		}
	}
}
