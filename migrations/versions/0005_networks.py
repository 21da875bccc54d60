"""Operators' network rules: one row per network (CIDR) denied or allowed, until an
optional expiry.

Revision ID: 0005_networks
Revises: 0004_ledger_webhooks
Create Date: 2026-12-04 09:00:00

A new table only: existing rows are untouched, and no network is denied or allowed
until an operator says so (flask quota networks, the dashboard's Networks page).
"""
from alembic import op
import sqlalchemy as sa


revision = '0005_networks'
down_revision = '0004_ledger_webhooks'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'quota_networks',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('cidr', sa.String(length=49), nullable=False),
        sa.Column('action', sa.String(length=8), nullable=False),
        sa.Column('reason', sa.String(length=200), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('created_by', sa.String(length=200), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "action IN ('deny', 'allow')", name=op.f('ck_quota_networks_action')
        ),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_quota_networks')),
        sa.UniqueConstraint('cidr', name=op.f('uq_quota_networks_cidr')),
    )


def downgrade() -> None:
    op.drop_table('quota_networks')
