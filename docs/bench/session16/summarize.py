"""Per file of sweep results: configs by (bits, family + form) and state (serial: every wait 0;
async; +HAZ: writes to registers of a wgmma in flight). python3 summarize.py 'GLOB'"""
import json,collections,sys,glob
for fn in sorted(glob.glob(sys.argv[1])):
    rs=[json.loads(l) for l in open(fn)]
    agg=collections.defaultdict(collections.Counter)
    err=sum('error' in r for r in rs)
    for r in rs:
        if 'error' in r: continue
        c=r['cfg']; kind=(r['bits'],c['kernel']+("+JOIN" if c.get('JOIN') else "")+("+BP" if c.get('BYTE_PAIRS') else "")+("+TAIL" if c.get("TAIL_SPLIT") else "")+("+WORDS" if c.get("WORDS") else "")+("+CAP" if c.get('MAXNREG') else ""))
        state = "serial" if r['waits']==[0] else ("nowait" if not r['waits'] else "async")
        agg[kind][state+("+HAZ" if r['hazards'] else "")]+=1
    print(fn.split('/')[-1], len(rs), "errors", err)
    for k,v in sorted(agg.items(), key=str): print("   ", k, dict(v))
