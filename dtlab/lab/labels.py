"""Every label the lab shows, in English and Simplified Chinese."""

from dtlab.i18n import register

register(
    {
        # plots
        "loss.title": ("Training loss", "训练损失"),
        "speed.title": ("Throughput", "吞吐量"),
        "memory.title": ("Memory per rank (last step)", "每个 rank 的显存/内存（最近一步）"),
        "time.title": ("Time per rank (last step)", "每个 rank 的时间（最近一步）"),
        "grad_norm.title": ("Global gradient norm (before clipping)", "全局梯度范数（裁剪前）"),
        "axis.step": ("step", "步"),
        "axis.loss": ("loss", "损失"),
        "axis.grad_norm": ("||g||", "||g||"),
        "axis.tokens_per_s": ("tokens / s", "tokens / 秒"),
        "axis.rank": ("rank", "rank 编号"),
        "axis.bytes": ("bytes", "字节"),
        "axis.seconds": ("seconds", "秒"),
        "mem.params": ("parameters", "参数"),
        "mem.grads": ("gradients", "梯度"),
        "mem.optimizer": ("optimizer state", "优化器状态"),
        "mem.master": ("fp32 master weights", "fp32 主权重"),
        "mem.activations": ("activations", "激活值"),
        "mem.copies": ("16-bit copies", "16 位副本"),
        "mem.buffers": ("buffers", "缓冲区"),
        "mem.workspace": ("workspace", "工作区"),
        "time.compute": ("compute", "计算"),
        "time.comm": ("communication", "通信"),
        "time.idle": ("idle", "空闲"),
        "trace.reference": ("single-process reference", "单进程参考"),
        "trace.predicted": ("{label}: predicted for this machine (planner)", "{label}：本机预测（规划器）"),
        "trace.run": ("dp={dp} tp={tp} pp={pp}", "dp={dp} tp={tp} pp={pp}"),
        "dash.none": ("No run drawn yet.", "还没有绘制任何运行。"),
        "dash.shown": (
            "Latest run: {config} · step {step} of {steps} (the per-rank plots show this run)",
            "最新一次运行：{config} · 第 {step} 步，共 {steps} 步（每个 rank 的图显示的是这次运行）",
        ),
        # controls
        "ctl.step": ("Step", "前进一步"),
        "ctl.reset": ("Reset", "重置"),
        "ctl.ranks": ("ranks N", "rank 数 N"),
        "ctl.dp": ("DP degree", "数据并行度 (DP)"),
        "ctl.model": ("model", "模型"),
        "ctl.schedule": ("schedule", "流水线调度"),
        "ctl.steps": ("steps", "步数"),
        "ctl.batch": ("global batch", "全局批大小"),
        "ctl.accum": ("grad. accumulation", "梯度累积"),
        "ctl.lr": ("learning rate", "学习率"),
        "ctl.seed": ("seed", "随机种子"),
        "ctl.experts": ("experts E", "专家数 E"),
        "ctl.top_k": ("top-k", "每个 token 的专家数 top-k"),
        "ctl.ep": ("EP degree", "专家并行度 (EP)"),
        "ctl.cp": ("CP degree", "上下文并行度 (CP)"),
        "ctl.sp": ("sequence parallel (SP)", "序列并行 (SP)"),
        "ctl.seq_len": ("sequence length", "序列长度"),
        "ctl.auto": ("run when a slider moves", "拖动滑块即运行"),
        "ctl.run": ("Run", "运行"),
        "ctl.stop": ("Stop", "停止"),
        "status.idle": (
            "ready: the pool starts on the first run, then stays warm",
            "就绪：首次运行时启动进程池，之后保持预热",
        ),
        "status.running": ("running dp={dp} on {world} rank(s)…", "正在 {world} 个 rank 上运行 dp={dp}……"),
        "status.done": (
            "done: {steps} steps, final loss {loss:.4f}, {tps:.0f} tokens/s",
            "完成：{steps} 步，最终损失 {loss:.4f}，{tps:.0f} tokens/秒",
        ),
        "status.stopped": ("stopped after {steps} steps", "已在第 {steps} 步后停止"),
        "status.error": ("error: {message}", "错误：{message}"),
        "plan.title": ("Planner's prediction (not measured)", "规划器的预测（非实测）"),
        "plan.local": (
            "this layout, per rank: params {params}, grads {grads}, optimizer {optimizer}",
            "本布局，每个 rank：参数 {params}，梯度 {grads}，优化器 {optimizer}",
        ),
        "plan.scaled": (
            "same layout on {gpus} x {gpu} (dp={dp}): {total} per GPU, step ≈ {step:.2f} ms, MFU ≈ {mfu:.2f}%",
            "同样布局放到 {gpus} 张 {gpu} 上（dp={dp}）：每卡 {total}，单步约 {step:.2f} 毫秒，MFU 约 {mfu:.2f}%",
        ),
        # planner explorer
        "pl.gpu": ("GPU", "GPU 型号"),
        "pl.dp": ("DP", "数据并行 DP"),
        "pl.tp": ("TP", "张量并行 TP"),
        "pl.pp": ("PP", "流水线并行 PP"),
        "pl.m": ("micro-batches", "微批次数"),
        "pl.zero": ("ZeRO stage", "ZeRO 阶段"),
        "pl.precision": ("precision", "精度"),
        "pl.recompute": ("recompute", "重计算"),
        "pl.title": ("Predicted memory per GPU (planner)", "每张 GPU 的预测显存（规划器）"),
        "pl.gb": ("GB", "GB"),
        "pl.capacity": ("GPU memory", "GPU 显存容量"),
        "pl.fits": ("fits", "放得下"),
        "pl.nofit": ("does NOT fit", "放不下"),
        "pl.summary": (
            "{gpus} GPUs: {total:.1f} GB of {capacity:.0f} GB per GPU — {fits}. "
            "Step ≈ {step:.2f} s, MFU ≈ {mfu:.1f}%, bubble {bubble:.1f}% (prediction)",
            "{gpus} 张 GPU：每卡 {total:.1f} GB / {capacity:.0f} GB —— {fits}。"
            "单步约 {step:.2f} 秒，MFU 约 {mfu:.1f}%，气泡 {bubble:.1f}%（预测值）",
        ),
        # checks
        "check.pass": (
            "✓ {name}: predicted {predicted}, {source} {measured}",
            "✓ {name}：预测 {predicted}，{source} {measured}",
        ),
        "check.fail": (
            "✗ {name}: predicted {predicted}, {source} {measured}",
            "✗ {name}：预测 {predicted}，{source} {measured}",
        ),
        "check.none": (
            "· {name}: no prediction written yet (write it in the cell above, then run again); {source} {measured}",
            "· {name}：还没有写下预测（请先在上面的单元格里写好，再重新运行）；{source} {measured}",
        ),
    }
)
